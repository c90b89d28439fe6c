"""Test-side infrastructure of the product's tests: the test PKI, private services and MTAs.

* ``certs``: trustme CA, MX certificate and SSL contexts.
* ``postfix_msa``, ``postfix_mx``, ``exim_msa``: private Postfix and Exim instances (tenant
  MSAs, an MX) for the reliability and interop tests; ``interop``: the interop matrix.
* ``postgres``, ``mariadb``, ``milters``, ``private_services``: private database and milter
  servers on free ports.
* ``log_corpus``, ``query_corpus``, ``filters``: session-log records and test filters.

The fake SMTP peers (the scriptable MX, the raw client, the ledger oracle) live in the lab,
shared with the demo and the benchmarks: ``mailsluice_lab.peers``.
"""
