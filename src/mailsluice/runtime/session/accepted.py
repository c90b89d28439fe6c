"""An accepted connection's task: its transport set up, then its session's whole life.

The proxy's accept loop (``net.listener``) hands each accepted socket to
``serve_accepted``, run in a task of the proxy's group: the loop makes the transport
(``connect_accepted_socket``) and ``ClientProtocol`` its handler; the task then does the
handler's jobs until the connection ends (``ConnectionHandler.run``). Compiled with the
rest of the session (issue 25): it runs once a connection.
"""

from __future__ import annotations

import logging
import socket

from mailsluice.runtime.services import ConnectionServices
from mailsluice.runtime.session.handler import ClientProtocol

__all__ = ["serve_accepted"]

log = logging.getLogger("mailsluice.server")


async def serve_accepted(services: ConnectionServices, conn: socket.socket) -> None:
    """Set up the accepted ``conn`` and serve it until it closes. A failure to set it up
    closes that connection only (one connection must never end the proxy's tasks)."""

    def protocol() -> ClientProtocol:
        return ClientProtocol(services, conn)

    try:  # (the loop makes the socket non-blocking)
        _, client = await services.loop.connect_accepted_socket(protocol, conn)
    except Exception as exc:
        log.warning("cannot set up an accepted connection: %s", exc)
        conn.close()
        return
    await client.handler.run()
