"""Test-side infrastructure: test MX servers, the ledger oracle, a raw SMTP client, test PKI.

* ``ledger``: ``Ledger``/``ClientResult`` -- what the MX stored vs. what the client was told.
* ``ledger_mx``: ``LedgerMX`` -- a well-behaved aiosmtpd MX on the test's event loop.
* ``scripted_mx``: ``ScriptedMX`` -- a fault-injecting MX (plans from ``faults``), with lenient
  (smuggling-vulnerable) and STARTTLS response-injection modes.
* ``client``: ``RawSMTPClient`` -- byte-exact SMTP client.
* ``certs``: trustme CA, MX certificate and SSL contexts.
"""
