"""One relayed connection: drives a ``Relay`` over the client transport and its MX leg.

The data path is synchronous: a transport callback feeds the relay and performs the
actions it returns (writes, closes, log records) in the same callback, with no task
switch per chunk. What must wait (dialling the MX, the TLS handshake, the filters,
sending a filtered message) is a job: the connection's own task, the one that accepted
it (``ConnectionHandler.run``), does the jobs one at a time in the order the relay asked
for them (the relay never asks for two waits at once), and ends when the relay closes.
A job that raises is a bug of ours: ``421 4.3.0`` for this connection, never a crash of
the server and never a 2xx.

The handler's collaborators, each in its own module of ``runtime.session``:
``opening`` (the route, admission, the source address, the place in the destination's
line, the ``Relay``; the source chosen again at each transaction's ``AcquireServer``),
``mxleg`` (the MX connection), ``borrowing`` (fair sharing), ``deadline`` (the relay's
timers, the minimum rate, the MX's write deadline), ``clienttls`` (the client's
STARTTLS), ``filterjob`` (filter mode), ``linger`` (a close that keeps our last reply),
``jobs`` (the waits, in order). The MX's reputation deferrals and refusals, and the
recipient domains of each transaction, go back to the source selector
(``sources.SourceFeedback``, an observer of the relay's records). Every exception of the
OS or of TLS becomes an event in ``runtime.errors``.

Backpressure (``flow``): a side whose write buffer is full pauses reading on the other
side; a client that sends more than the relay will hold is paused until the relay catches
up. Every wait has a deadline (the relay's ``SetTimer``, the connect timeout, the write
deadline of an MX that stops reading).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from functools import partial
from typing import cast

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.machine import Relay
from mailsluice.relay.records import TransactionEnded
from mailsluice.runtime import errors
from mailsluice.runtime.services import ConnectionServices
from mailsluice.runtime.session.borrowing import Borrowing
from mailsluice.runtime.session.clienttls import ClientTlsUpgrade
from mailsluice.runtime.session.deadline import Deadline
from mailsluice.runtime.session.dialprobe import GreetingWatch
from mailsluice.runtime.session.filterjob import FilterDriver
from mailsluice.runtime.session.flow import Flow
from mailsluice.runtime.session.jobs import Jobs
from mailsluice.runtime.session.linger import LingeringClose
from mailsluice.runtime.session.mxleg import MxLeg
from mailsluice.runtime.session.opening import choose_source, open_session
from mailsluice.runtime.session.sides import SessionEvents, Side, format_address
from mailsluice.runtime.sources import SourceFeedback

__all__ = ["ClientProtocol", "ConnectionHandler"]

log = logging.getLogger("mailsluice.connection")


class ClientProtocol(Side):
    """The accepted connection; makes its handler when the connection is made."""

    def __init__(self, services: ConnectionServices, sock: socket.socket | None = None) -> None:
        self._services = services
        self._sock = sock  # the accepted socket (None: the transport's is asked for)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        handler = ConnectionHandler(
            self._services, cast(asyncio.Transport, transport), sock=self._sock
        )
        super().__init__(handler, client=True)
        self._services.started(handler)
        handler.begin()

    @property
    def handler(self) -> ConnectionHandler:
        """The handler (made in ``connection_made``); its task awaits ``handler.run()``."""
        return cast(ConnectionHandler, self._session)


class ConnectionHandler(SessionEvents):
    """Owns one client transport, its MX leg and its Relay."""

    __slots__ = (
        "_borrowing", "_client", "_client_eof", "_client_tls", "_clock", "_deadline", "_filters",
        "_flow", "_jobs", "_lingering", "_loop", "_peer", "_services", "_sources", "mx", "relay",
    )  # fmt: skip

    def __init__(
        self,
        services: ConnectionServices,
        client: asyncio.Transport,
        *,
        sock: socket.socket | None = None,
    ) -> None:
        self._services = services
        self._loop = services.loop
        self._clock: Callable[[], float] = self._loop.time  # looked up once: read every event
        self._client: asyncio.Transport | None = client
        self._client_eof = False  # the client half-closed: it reads our replies, sends nothing
        self._client_tls: ClientTlsUpgrade | None = None  # its handshake is under way: no writes
        timeouts = services.relay_config.timeouts
        self._deadline = Deadline(
            self._loop, data_block=timeouts.data_block, min_rate=timeouts.client_min_rate,
            expired=partial(self._feed, ev.TimerExpired()), write_timed_out=self._write_timed_out,
        )  # fmt: skip
        self._flow = Flow(services.relay_config.max_pending_input)  # who may read
        self._lingering: LingeringClose | None = None  # a closed client, drained before close
        self._jobs = Jobs(self._loop)
        self._filters: FilterDriver | None = None  # filter mode only (``_driver``)
        # what the opening's callbacks read, before it runs (``_mx_side`` when the pool
        # gives a connection at once, ``_feed`` when a dial fails)
        self.relay: Relay | None = None
        self._borrowing: Borrowing | None = None  # fair sharing: its place in the line
        opened = open_session(
            services, client, sock=sock, feed=self._feed, feed_soon=self._feed_soon,
            is_open=self._relay_open, dial=self._dial, mx_side=self._mx_side,
        )  # fmt: skip
        self.mx: MxLeg = opened.mx
        self.relay = opened.relay
        self._borrowing = opened.borrowing
        self._peer = opened.client_ip  # the client's address
        self._sources: SourceFeedback | None = opened.sources  # what the MX says counts

    @property
    def destination(self) -> tuple[str, int]:
        return self.mx.destination

    def begin(self) -> None:
        """Start the relay (in ``connection_made``, before any data can arrive)."""
        relay = self.relay
        assert relay is not None
        self._perform(relay.start())
        if relay.closed:  # refused: nothing to wait for
            self._jobs.stop()

    async def run(self) -> None:
        """The connection's lifetime: do the relay's jobs until it closes."""
        relay = self.relay
        assert relay is not None
        try:
            while (job := await self._jobs.next()) is not None:
                await job()
        except Exception as exc:
            log.exception("session %s: internal error", relay.session_id)
            if not relay.closed:
                self._feed(errors.internal_error(exc))
        finally:
            self._teardown()

    # ------------------------------------------------------------ events in
    def _feed(self, event: ev.Event) -> None:
        relay = self.relay
        if relay is not None and not relay.closed:
            try:
                actions = relay.handle(event, self._clock())
            except Exception as exc:
                self._internal_failure(relay, exc)
                return
            self._stepped(relay, actions)

    def on_data(self, from_client: bool, data: bytes) -> None:
        """Bytes from either side: the hot path (``Relay.client_data``/``server_data``).

        The MX's silence is measured from its last byte. The client's deadline is not
        restarted by a partial line or a body chunk, only extended by the chunk's size at
        ``client_min_rate``; the relay restarts it (``SetTimer``) when a line completes.
        """
        upgrade = self._client_tls
        if from_client and upgrade is not None:
            # TLS data, decrypted, that the client sent right after its handshake (before
            # the handshake's end was reported to the relay): given to it after that.
            if not upgrade.hold(data) and self._client is not None:
                self._client.abort()
            return
        relay = self.relay
        if relay is None or relay.closed:
            lingering = self._lingering
            if from_client and lingering is not None and lingering.transport is not None:
                lingering.drain(len(data))
            return
        now = self._clock()
        self._deadline.heard(from_client, len(data), now)
        if not from_client and self.mx.settling:  # the first reply over TLS: it can be kept
            self.mx.tls_settled()
        # (each side's method called by name: compiled, a direct call; a bound method
        # chosen first would be an object made and called generically at every read)
        try:
            actions = relay.client_data(data, now) if from_client else relay.server_data(data, now)
        except Exception as exc:
            self._internal_failure(relay, exc)
            return
        self._stepped(relay, actions)

    def _stepped(self, relay: Relay, actions: list[act.Action]) -> None:
        """The relay took one input (``_feed``, ``on_data``; a bug of ours in it is
        ``_internal_failure``'s): perform its actions, then stop or resume reading the
        client's backlog."""
        self._perform(actions)
        client = self._client
        if client is not None and not self._client_eof:
            self._flow.backlog(client, relay.client_backlog)
        if relay.closed:
            self._jobs.stop()

    def _internal_failure(self, relay: Relay, exc: Exception) -> None:
        """A bug of ours while the relay took an input: 421 4.3.0 for this connection if
        the relay still can answer, never a crash of the server and never a 2xx; otherwise
        just close both sides."""
        log.exception("session %s: internal error", relay.session_id)
        try:
            self._perform(relay.handle(errors.internal_error(exc), self._clock()))
        except Exception:
            log.exception("session %s: cannot even report the error; closing", relay.session_id)
            self.mx.abort()
            if self._client is not None:
                self._client.abort()
            self._client = None
            self.relay = None
        self._jobs.stop()

    def on_eof(self, from_client: bool) -> bool:
        """End of stream from one side. The client's is a half-close, not a loss: it
        still reads, so its transport stays open for the replies it is owed (the relay
        closes it when none is left). The MX's ends that leg."""
        if not from_client:
            self.on_closed(False, "end of stream")
            return False
        if self._client is None or self._client_eof:
            return False  # closed by us already (a lingering close): let it go
        self._client_eof = True
        self._feed(ev.ClientEof())
        return self._client is not None

    def on_closed(self, from_client: bool, reason: str) -> None:
        if from_client:
            if self._client is not None:
                self._client = None
                self._feed(ev.ClientClosed())
        elif self.mx.transport is not None:
            self.mx.transport = None
            # The relay first: a connection lost during its set-up goes back in line
            # (``Requeue``), which needs the slot it held; otherwise the slot is free.
            self._feed(ev.ServerClosed(reason))
            self._let_go()

    def on_write_paused(self, to_client: bool, paused: bool) -> None:
        if not to_client:
            if self._filters is not None:
                self._filters.server_writable(not paused)
            self._deadline.blocked(paused)
        self._flow.write_paused(self.mx.transport if to_client else self._client, to_client, paused)

    def shutdown(self, forced: bool) -> None:
        self._feed(ev.ShutdownForced() if forced else ev.ShutdownRequested())

    def abort(self) -> None:
        """The operator ends the session (``ctl abort``): 421, its own close reason."""
        self._feed(ev.Aborted())

    def held_lines(self) -> tuple[tuple[int, float, str, str], ...]:
        """The transcript lines the relay holds, not yet in the log."""
        return self.relay.held_lines() if self.relay is not None else ()

    def live(self) -> dict[str, object] | None:
        """The session as the admin API shows it (None: no relay, or closed)."""
        relay = self.relay
        if relay is None or relay.closed:
            return None
        view = relay.live()
        return {
            "id": view.session_id, "client": view.client, "tenant": self._services.tenant_of(
                self._peer), "destination": view.destination, "source": view.source_ip,
            "phase": view.phase, "opened_at": view.opened_at, "messages": view.messages,
            "bytes": view.relayed_bytes, "mail_from": view.mail_from,
        }  # fmt: skip

    # ------------------------------------------------------------ actions out
    def _perform(self, actions: list[act.Action]) -> None:
        # Commonest first: this runs for every chunk relayed.
        for action in actions:
            if isinstance(action, act.SendToClient):
                if self._client is not None and self._client_tls is None:
                    self._client.write(action.data)
            elif isinstance(action, act.SendToServer):
                server = self.mx.transport
                if server is not None:
                    server.write(action.data)
            elif isinstance(action, act.Log):
                record = action.record
                self._services.submit_record(record)
                if self._borrowing is not None:
                    self._borrowing.observe(record)
                if self._sources is not None and isinstance(record, TransactionEnded):
                    self._sources.transaction(record)
            elif isinstance(action, act.SetTimer):
                self._deadline.arm(action.seconds, action.on_server)
            else:
                self._perform_rare(action)

    def _perform_rare(self, action: act.Action) -> None:
        # The ones every transaction or session has first; a class pattern without
        # captures, its fields read on the narrowed action (issue 25: each pattern tried
        # is an isinstance, a positional capture a generic attribute look-up).
        match action:
            case act.AcquireServer():
                assert self._borrowing is not None, "only a borrowing relay asks for a slot"
                if self._sources is not None:
                    choose_source(
                        self._services,
                        self.mx,
                        self._borrowing,
                        self._peer,
                        action.sender,
                        action.recipient,
                    )
                self._borrowing.ask()
            case act.ReleaseServer():
                if self._borrowing is None:
                    self.mx.release(action.state)
                else:
                    self._borrowing.release(action.state, keep=action.keep)
            case act.CloseClient():
                client, self._client = self._client, None
                if client is not None:
                    if self._client_tls is not None:  # mid-handshake: nothing more to say
                        client.abort()
                    elif action.linger:
                        self._linger(client)
                    else:
                        client.close()
                if self._filters is not None:
                    self._filters.cancel()
            case act.CloseServer():
                if self._borrowing is None or not self.mx.close_counted():
                    self.mx.close()
                    self._let_go()
            case act.MxDeferred():
                if self._borrowing is not None:
                    self._borrowing.deferred(action.code, action.text)
                if self._sources is not None:
                    self._sources.deferred(action.code, action.text)
            case act.Requeue():
                self.mx.abort()
                if self._borrowing is None:
                    self._feed_soon(ev.ServerConnectFailed(action.reason))
                else:
                    self._borrowing.requeue(action.reason, capacity=action.capacity)
            case act.CancelAcquire():
                if self._borrowing is not None:
                    self._borrowing.cancel()
            case act.ConnectServer():
                self._dial()
            case act.StartServerTls():
                if self.mx.transport is not None:
                    self.mx.transport.pause_reading()
                self._jobs.add(self.mx.start_tls_by_policy)
            case act.StartClientTls():
                client, context = self._client, self._services.client_tls_context
                if client is not None and context is not None and not client.is_closing():
                    upgrade = ClientTlsUpgrade(
                        self._loop, client, context, limit=self._flow.max_backlog
                    )
                    self._client_tls, self._client = upgrade, upgrade.tls
                    self._jobs.add(partial(self._client_handshake, upgrade))
                else:  # (gone, or a bug of ours: no context, yet TLS was offered)
                    self._feed_soon(ev.ClientTlsFailed("no connection or no TLS context"))
            case act.SpoolData():
                self._driver().spool(action.data)
            case act.RunFilters():
                self._jobs.add(partial(self._run_filters, action))
            case act.SendSpooled():
                self._jobs.add(self._send_spooled)
            case act.DropSpool():
                if self._filters is not None:
                    self._filters.drop()
            case act.TlsBroken():
                self._services.tls_failed(format_address(self.destination), time.time())
            case act.CheckTlsPolicy():
                self._jobs.add(partial(self._check_tls_policy, action.domain))
            case _:
                log.error("session %s: unknown relay action %r", self._session_id(), action)

    async def _check_tls_policy(self, domain: str) -> None:
        self._feed(await self.mx.check_policy(domain))

    async def _client_handshake(self, upgrade: ClientTlsUpgrade) -> None:
        """The client's TLS handshake (``StartClientTls``), within its deadline."""
        outcome = await upgrade.handshake()
        self._client_tls = None
        tls = upgrade.tls
        if isinstance(outcome, ev.ClientTlsFailed):
            if self._client is tls:
                self._client = None
            tls.abort()
            self._feed(outcome)
            return
        if self._client is not tls:  # closed meanwhile
            return
        self._feed(outcome)
        early = upgrade.early()
        if early:
            self.on_data(True, early)

    def _relay_open(self) -> bool:
        return self.relay is not None and not self.relay.closed

    def _dial(self) -> None:
        """Connect to the MX (a job: after what the relay asked before it)."""
        self._jobs.add(partial(self.mx.connect, self._relay_open))

    def _mx_side(self) -> Side:
        """The MX transport's protocol (a new connection's notes its greeting's time)."""
        probe = self._borrowing.probe if self._borrowing is not None else None
        if probe is not None and probe.greeting is None:
            return GreetingWatch(self, probe)
        return Side(self, client=False)

    def _feed_soon(self, event: ev.Event) -> None:
        """An event for the relay on the loop's next turn (never inside its own step)."""
        self._loop.call_soon(self._feed, event)

    def _let_go(self) -> None:
        """The MX connection is over: its slot is free."""
        hold = self.mx.let_go()
        if hold is not None:
            hold.destination.lost(hold)

    def _linger(self, client: asyncio.Transport) -> None:
        """Close the client without destroying our last replies (``linger``)."""
        self._lingering = LingeringClose(self._loop)
        self._lingering.start(client)

    def _session_id(self) -> str:
        return self.relay.session_id if self.relay is not None else "?"

    def _write_timed_out(self) -> bool:
        """The MX stopped reading: given up, with what it did not take."""
        if self.mx.transport is None:
            return False
        self.mx.abort()
        self._feed(errors.write_timed_out())
        return True

    # ------------------------------------------------------------ filter mode
    async def _run_filters(self, run: act.RunFilters) -> None:
        relay = self.relay
        if relay is None or relay.closed:
            return
        decided = await self._driver().run(
            run, session_id=relay.session_id,
            peer=self._client.get_extra_info("peername") if self._client else None,
            destination=format_address(self.destination), source_ip=self.mx.source_ip,
        )  # fmt: skip
        if decided is not None:
            self._feed(decided)

    async def _send_spooled(self) -> None:
        await self._driver().send(self.mx.write)

    def _driver(self) -> FilterDriver:
        """The connection's filter-mode state, made when filter mode first needs it."""
        if self._filters is None:
            services = self._services
            self._filters = FilterDriver(
                services.filtering, services.relay_config.message_size_limit,
                services.filter_chain, writable=not self._flow.server_blocked,
            )  # fmt: skip
        return self._filters

    def _teardown(self) -> None:
        if self._filters is not None:
            self._filters.drop()
        self._deadline.release()
        self.mx.close()
        self._let_go()
        if self._borrowing is not None:
            self._borrowing.end()
        if self._client is not None:
            self._client.close()
            self._client = None
        self.mx.forget()
        self._services.ended(self)
        # No cycle left (the collaborators drop their callbacks to this handler, the relay's
        # parts their way back to it): the connection's objects go by reference counts, not
        # by the cycle collector, which cost several percent of the worker (issue 25).
        self.mx.unhook()
        if self.relay is not None:
            self.relay.dispose()
