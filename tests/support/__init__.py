"""Test-side infrastructure of the product's tests: the test PKI, private services and MTAs.

* ``certs``: trustme CA, MX certificate and SSL contexts.
* ``postfix_mx``, ``exim_msa``: private Postfix and Exim instances (an MX, tenant MSAs) for
  the reliability and interop tests, the Postfix ones built on the lab's one Postfix harness
  (``mailsluice_lab.postfix``); ``interop``: the interop matrix.
* ``postgres``, ``mariadb``, ``milters``, ``private_services``, ``redis_server``: private
  database, milter and Redis servers on free ports (the lab's ``free_port``).
* ``log_corpus``, ``query_corpus``, ``filters``: session-log records and test filters.

The fake SMTP peers (the scriptable MX, the raw client, the ledger oracle) live in the lab,
shared with the demo and the benchmarks: ``mailsluice_lab.peers``; so do the one
``free_port`` and the one process sampler (``mailsluice_lab.processes``).
* ``pure_tier``: the unit tier's guard (``tests/unit/conftest.py``).
"""
