"""The relay: one SMTP session between a tenant MSA and its destination MX, as pure values.

Sans-I/O: ``machine.Relay`` takes events (bytes from either side, connection results,
timers; ``events``) and returns actions (bytes to write, connections to open or close,
timers, log records; ``actions``). No sockets, no clock, no asyncio: ``runtime`` is the
shell that performs the actions.

Where things are:

* ``state``: everything that decides what happens next (the session's stage, the
  client's input, the MX link, the message) with its legal moves, and the two queues:
  the replies the client is owed, the commands the MX has not answered.
* ``machine``: ``Relay``, the event dispatch and the client's commands, and the two
  exhaustive matches that complete a reply (when it arrives from the MX, when it is
  sent to the client).
* collaborators, each writing to one ``outbox.Outbox``: ``upgrade`` (EHLO and STARTTLS
  toward the MX), the data phase (``streaming`` or ``filtered``, over ``body``), the
  upstream lease (``lease``).
* ``accounting`` and ``records``: the session log's records; ``config``: limits, modes
  and the timeout budget.

Allowed imports: ``mailsluice.smtp`` and this package; nothing that does I/O.
"""
