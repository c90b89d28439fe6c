"""The admin HTTP server (``admin_listen``) and what it serves.

``http`` is the server (h11, a router, bearer auth, deadlines and caps), ``routes`` the
routes (``/metrics``, ``/healthz``, ``/readyz``), ``collect`` the per-destination and
per-tenant-group metrics read from the scheduler at scrape time, ``multiproc`` the
metrics of ``--workers N`` (``prometheus_client``'s multi-process mode), ``host`` the
wiring: a worker's metrics and, where it runs, the server. The recorder the relay's
records feed is ``runtime.metrics``.
"""
