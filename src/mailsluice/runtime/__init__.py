"""The asyncio shell around the relay: sockets, processes, timers, TLS. Its rooms, each
importing only those under it (the runtime contract in ``pyproject.toml``):

* ``launch``: the process (one, or ``--workers N`` under ``process.workers.supervise``,
  with the broker and the admin helper); ``server.Proxy``: the composition root of a
  running proxy (settings, the log writer, the services, the listening sockets, the
  TaskGroup every connection's task lives in) and its graceful shutdown; ``reload``
  applies a SIGHUP; ``generation`` builds a generation of the connection's services,
  the same way at start and at reload; ``startup`` refuses settings that would fail
  every session.
* ``services``: ``ConnectionServices``, what a connection uses (routing, admission, TLS
  memory, the log, the pool), and the proxy's ``Services``.
* ``session``: one connection's shell: ``handler.ConnectionHandler`` drives one
  ``relay.machine.Relay`` over the client transport and its ``mxleg.MxLeg`` (dial, TLS,
  reuse), with its opening, flow control, deadlines, the client's STARTTLS, filter mode.
* ``fair`` (the scheduler's worker side, the broker, the pool of idle connections),
  ``fleet`` (several gateways through Redis), ``tls`` (both legs' TLS), ``net``
  (admission, the accept loop, dialling, ``SO_ORIGINAL_DST``), ``process`` (workers,
  systemd's notify), ``admin`` (the admin server); ``errors``: where OS and TLS
  exceptions become relay events.

Allowed imports: ``relay``, ``smtp``, ``policy``, ``scheduling``, ``filtering``,
``milter``, ``plugins``, ``sessionlog``, ``settings``; never the lab (benchmarks, demo)
and never the CLI.
"""
