"""A session's opening, and its source address chosen again for each transaction.

``open_session`` is what happens when a client connects, before the relay says
anything: the destination it meant (the fixed upstream, or ``SO_ORIGINAL_DST``; one that
cannot be read is a refusal, ``services.routing_failure``), whether it may connect
(``services.admit``), the source address it leaves from (``runtime.sources``: chosen by
tenant and destination), its place in the destination's line under fair sharing
(``Borrowing``), the idle connection of the pool it may take over, and the ``Relay``
itself with what is known of the MX's TLS.

``choose_source`` runs at each transaction's ``AcquireServer`` under fair sharing: the
source chosen again now that the sender is known (the session's kept while it is still
eligible), the ``Borrowing`` moved to that (source, MX) destination.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from mailsluice.relay import events as ev
from mailsluice.relay.machine import Relay
from mailsluice.runtime.net.dialer import plain_host
from mailsluice.runtime.net.origdst import AcceptedSocket
from mailsluice.runtime.services import OpeningServices
from mailsluice.runtime.session.borrowing import Borrowing
from mailsluice.runtime.session.mxleg import MxLeg
from mailsluice.runtime.session.sides import Side, format_address
from mailsluice.runtime.sources import SourceFeedback

__all__ = ["Opened", "choose_source", "open_session"]

log = logging.getLogger("mailsluice.connection")


@dataclass(slots=True)
class Opened:
    """What the opening made, for the handler to own."""

    mx: MxLeg
    relay: Relay
    client_ip: str  # the client's address, plain (no IPv4-mapped prefix)
    borrowing: Borrowing | None  # fair sharing: its place in the line (None: off, refused)
    sources: SourceFeedback | None  # source pools: what the MX says counts (None: none)

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(
        self,
        mx: MxLeg,
        relay: Relay,
        client_ip: str,
        borrowing: Borrowing | None,
        sources: SourceFeedback | None,
    ) -> None:
        self.mx = mx
        self.relay = relay
        self.client_ip = client_ip
        self.borrowing = borrowing
        self.sources = sources


def open_session(
    services: OpeningServices,
    client: asyncio.Transport,
    *,
    sock: socket.socket | None = None,
    feed: Callable[[ev.Event], None],
    feed_soon: Callable[[ev.Event], None],
    is_open: Callable[[], bool],
    dial: Callable[[], None],
    mx_side: Callable[[], Side],
) -> Opened:
    """Route, admit and set up one accepted connection (see the module docstring).
    ``feed``/``feed_soon`` hand the relay an event now or on the loop's next turn;
    ``is_open`` says whether the relay still runs; ``dial`` connects to the MX (a job);
    ``mx_side`` makes the MX transport's protocol; ``sock`` is the accepted socket (None:
    the transport's is asked for)."""
    loop = services.loop
    peername = client.get_extra_info("peername")
    peer = peername or ("?", 0)
    # the socket only where it is needed (SO_ORIGINAL_DST, the loop check), with the two
    # addresses the loop read already
    accepted = None
    if services.transparent:
        accepted = AcceptedSocket(
            sock if sock is not None else client.get_extra_info("socket"),
            client.get_extra_info("sockname"), peername,
        )  # fmt: skip
    refusal = None
    destination = ("", 0)
    try:
        destination = services.route(accepted)
    except OSError as exc:
        log.warning("cannot route %s: %s", format_address(peer), exc)
        refusal = services.routing_failure(str(exc), peer[0])
    now = time.time()
    if refusal is None:
        refusal = services.admit(peer[0], destination, accepted)
    mx = MxLeg(services, destination, feed=feed, protocol=mx_side)
    dest = format_address(destination)
    mx_ip = plain_host(destination[0])
    client_ip = plain_host(peer[0])
    tenant = services.tenant_of(peer[0])
    sources = None
    if services.sources.configured and refusal is None:
        mx.source = services.sources.choose(
            tenant=tenant, client_ip=client_ip, mx_ip=mx_ip, now=now
        )
        sources = SourceFeedback(
            services.sources, mx_ip=mx_ip, source_ip=lambda: mx.source_ip,
            rules=services.deferral_rules,
        )  # fmt: skip
    destinations = services.destinations
    borrowing = None
    cached = None
    if destinations is not None and refusal is None:
        key = (mx.source_ip or "", mx_ip, destination[1])
        borrowing = Borrowing(
            destinations.get(key), tenant, tickets=destinations, mx=mx, feed=feed,
            feed_soon=feed_soon, is_open=is_open, dial=dial,
            deferral_rules=services.deferral_rules,
        )  # fmt: skip
        cached = borrowing.destination.memo
        borrowing.hello_name = mx.source.ehlo if mx.source is not None else None
    reused = mx.take_pooled(peer[0]) if refusal is None and destinations is None else None
    relay = Relay(
        config=services.relay_config,
        session_id=services.new_session_id(),
        client=format_address(peer),
        destination=dest,
        source_ip=mx.source_ip,
        tls_allowed=services.tls_allowed(dest, now) and services.mx_tls.allowed(mx_ip),
        tls_required=refusal is None and services.mx_tls.required(mx_ip),
        refusal=refusal,
        reused=reused,
        may_release=services.pool is not None,
        borrowed=borrowing is not None,
        cached=cached,
        client_tls=services.client_tls_context is not None,
        now=loop.time(),  # the relay's clock is monotonic; its records, wall time
        wall=now - loop.time(),
    )
    return Opened(mx, relay, client_ip, borrowing, sources)


def choose_source(
    services: OpeningServices,
    mx: MxLeg,
    borrowing: Borrowing,
    client_ip: str,
    sender: str,
    recipient: str,
) -> None:
    """A transaction asks for a connection: its source address, chosen again now that
    its sender is known (the session's kept while eligible); its (source, MX) is the
    destination whose fair share it waits in."""
    current = mx.source_ip
    host, port = mx.destination
    mx_ip = plain_host(host)
    source = services.sources.choose(
        tenant=borrowing.tenant, client_ip=client_ip, mx_ip=mx_ip, now=time.time(),
        sender=sender or None, recipient=recipient or None, current=current,
    )  # fmt: skip
    mx.source = source
    borrowing.hello_name = source.ehlo if source is not None else None
    new_ip = source.address if source is not None else None
    destinations = services.destinations
    if new_ip != current and destinations is not None:
        borrowing.move(destinations.get((new_ip or "", mx_ip, port)))
