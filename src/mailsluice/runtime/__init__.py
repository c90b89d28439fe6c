"""The asyncio shell around the relay: sockets, processes, timers, TLS.

* ``server.Proxy``: the composition root of a running proxy (settings, the log writer,
  the services, the listening sockets, the TaskGroup every connection's task lives in)
  and its graceful shutdown; ``workers`` forks ``--workers N`` processes sharing the
  port; ``listener`` is the accept loop; ``startup`` refuses settings that would fail
  every session.
* ``services``: ``ConnectionServices``, the one small interface a connection uses
  (routing, ``admission``, TLS memory, the log, the pool), and the proxy's ``Services``.
* ``handler.ConnectionHandler``: drives one ``relay.machine.Relay`` over the client
  transport and its ``mxleg.MxLeg`` (dial, TLS, reuse); ``sides`` are the transports'
  protocol objects; ``linger`` closes a client without losing our last replies;
  ``filterjob`` spools and judges a message in filter mode; ``upstreampool`` keeps idle
  MX connections for reuse.
* ``errors``: where OS and TLS exceptions become relay events; ``dialer``, ``origdst``,
  ``tls``, ``localaddrs``: the OS-facing helpers.

Allowed imports: ``relay``, ``smtp``, ``policy``, ``filtering``, ``milter``, ``plugins``,
``sessionlog``, ``config``; never the lab (benchmarks, demo) and never the CLI.
"""
