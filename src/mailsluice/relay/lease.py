"""The upstream lease: when the session has an MX connection, and when it gives it back.

``DedicatedLease`` is the binding mailsluice has always had: the session owns its MX
connection from its first byte to its last. It dials at the start, or, with connection
reuse, starts on an idle connection of the same client to the same destination that
the shell kept (``runtime.upstreampool``):

* the MX's greeting is replayed (no round trip);
* the first EHLO (or HELO) is answered with the reply the MX gave to the same command
  (for EHLO, the capability list as the client saw it); a different name or verb goes
  to the MX, which resets its state (RFC 5321 §4.1.4);
* from MAIL FROM on, the MX's real replies, the same rules. If the MX dropped the idle
  connection meanwhile, the client gets ``421 4.4.2`` and retries.

At QUIT, a session that may release and whose MX connection is idle and known good
(after a positive EHLO/HELO, no transaction, nothing owed or awaited, nothing against it
in ``keep.KeepCheck``) emits ``ReleaseServer`` instead of relaying QUIT and answers
``221`` itself.

After a message the proxy refused itself mid-body (``cut``: the connection was closed
instead of sending the dot), the session goes on without a connection: RSET, NOOP and
QUIT are answered here, and the next command for the MX dials a new one, which the
proxy sets up itself (greeting, the client's EHLO name, STARTTLS: ``setup``).

``borrowed.BorrowedLease`` (late binding, for the fair-sharing scheduler) implements the
same ``Lease`` interface: it borrows a connection per transaction and hands it back
after it.
"""

from __future__ import annotations

from typing import Protocol

from mailsluice.relay import actions as act
from mailsluice.relay.accounting import address_text
from mailsluice.relay.keep import KeepCheck
from mailsluice.relay.outbox import Conductor, Outbox
from mailsluice.relay.records import Direction
from mailsluice.relay.setup import (
    BYE,
    IDLE_ANSWERS,
    default_hello,
    hello_text,
    pipelines,
    send_hello,
)
from mailsluice.relay.state import (
    Await,
    IllegalMove,
    Link,
    Message,
    On,
    Owed,
    RelayState,
    Sent,
    Slot,
    Stage,
)
from mailsluice.smtp.commands import Command
from mailsluice.smtp.replies import Reply


class Lease(Protocol):
    """When the session has an MX connection: what the relay asks of its lease."""

    def start(self) -> None:
        """The session begins: dial, start on a reused connection, or greet from memory."""

    def hello(self, command: Command) -> bool:
        """EHLO/HELO: True when the lease answered it (from memory), False: relay it."""

    def reachable(self) -> bool:
        """Whether a command for the MX can go to it now or once the link is ready."""

    def idle_answer(self, command: Command) -> bool:
        """RSET, NOOP...: True when the lease answered it (no connection is held)."""

    def need_link(self) -> None:
        """A command waits in ``held``: get the link ready (late binding asks for one)."""

    def remember_greeting(self, reply: Reply) -> None:
        """The MX's greeting reached the client (the client drove the set-up)."""

    def remember_hello(self, slot: Slot | None, client_reply: Reply) -> None:
        """The MX's answer to EHLO/HELO is final (``slot`` None: our own, in a set-up)."""

    def cut(self) -> None:
        """The relay closed the link in the middle of a transaction it refused itself (a
        body it will not complete): the next transaction gets another connection."""

    def spent(self, sent: Sent, reply: Reply) -> bool:
        """The MX closes the channel (421) in answer to a transaction's MAIL: True when
        the lease moves the transaction to another connection (the MX ends a connection
        that carried transactions before, not this one: Exim's
        ``smtp_accept_max_per_connection``); False: the client gets the 421."""

    def quit(self, command: Command) -> bool:
        """QUIT: True when the lease answered it, False: relay it to the MX."""

    def after_reply(self) -> None:
        """A reply reached the client: the moment to hand an idle connection back."""

    def granted(self, hello_name: str | None = None) -> None:
        """Late binding: a slot is ours, the shell dials (from an address whose EHLO name
        is ``hello_name``: what the lease's own set-up says; None: the client's)."""

    def reused(self, upstream: act.ReusedUpstream) -> None:
        """Late binding: an idle connection of the tenant is ours."""

    def connected(self) -> None:
        """The dial succeeded (the link is DIALLING)."""

    def greeting(self, sent: Sent, reply: Reply) -> bool:
        """The MX's greeting (``sent`` is its entry, just taken off ``awaiting``): True when
        the lease took it (late binding: our own set-up's, or a capacity refusal at a
        first contact, which puts the session back in line); False: it goes to the client."""

    def lost_before_use(self, reason: str) -> bool:
        """The connection failed before a transaction used it (the dial, or a close
        during the set-up or before a first contact's greeting): True when the lease puts
        the session back in line (late binding; the shell judges whether it waits
        again); False: the relay's usual failure."""

    def wait_ran_out(self, text: str | None = None) -> None:
        """Late binding: ``hold_max`` passed with no slot (or, with ``text``, the
        scheduler said none will come now)."""


class DedicatedLease:
    """The session's own MX connection, dialled at the start or taken from the pool."""

    __slots__ = ("_client_hello", "_destination", "_first_hello", "_greeting", "_hello",
                 "_host", "_keep", "_may_release", "_out", "_relay", "_reused",
                 "_state")  # fmt: skip

    def __init__(
        self,
        state: RelayState,
        out: Outbox,
        relay: Conductor,
        *,
        destination: str,
        hostname: str,
        keep: KeepCheck,
        reused: act.ReusedUpstream | None,
        may_release: bool,
    ) -> None:
        self._destination = destination
        self._host = hostname
        self._state = state
        self._out = out
        self._relay = relay
        self._keep = keep  # what the MX has shown of the connection (``keep``)
        self._reused = reused
        self._may_release = may_release  # the shell keeps connections (reuse is on)
        memo = reused.state if reused is not None else None
        self._greeting: Reply | None = memo.greeting if memo else None
        self._hello: tuple[str, Reply] | None = (memo.hello, memo.hello_reply) if memo else None
        self._first_hello = memo is not None  # the first EHLO/HELO may come from the memo
        self._client_hello: Command | None = None  # the client's last EHLO/HELO

    def start(self) -> None:
        """Dial, or start on the reused connection (its greeting replayed)."""
        state = self._state
        reused = self._reused
        if reused is None:
            slot = Slot(Owed.GREETING)
            state.owed.append(slot)
            state.awaiting.append(Sent(Await.GREETING, slot))
            state.on(On.DIALLED)
            self._out.add(act.ConnectServer())
            return
        state.on(On.REUSED)
        state.on(On.GREETED)
        state.pipelining = pipelines(reused.state)
        self._out.account.tls = reused.state.tls
        self._out.note(
            f"reusing the connection to {self._destination} from {reused.source} "
            f"(client session {reused.sessions + 1} on it)"
        )
        self._out.to_client(reused.state.greeting, Direction.PROXY_TO_CLIENT)

    def hello(self, command: Command) -> bool:
        """Answer the first EHLO/HELO of a reused session from the memo, when it is the one
        the MX last answered and nothing is open upstream; False: it goes to the MX."""
        self._client_hello = command
        first, self._first_hello = self._first_hello, False
        memo = self._hello
        state = self._state
        idle = not state.owed and not state.awaiting
        if first and idle and memo is not None and memo[0] == hello_text(command):
            self._out.account.helo = address_text(command.argument)
            self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self._relay.local(memo[1], hello=command)
            return True
        self._hello = None  # until the MX's positive reply to the one that goes out
        return False

    def remember_greeting(self, reply: Reply) -> None:
        if self._may_release:
            self._greeting = reply if reply.code == 220 else None

    def remember_hello(self, slot: Slot | None, client_reply: Reply) -> None:
        """The reply the client got to EHLO/HELO (after TLS, edited): what a session on
        this connection later gets for the same command. ``slot`` None: the end of our
        own set-up of a connection dialled again (``cut``)."""
        command = slot.command if slot is not None else self._setup_hello()
        if slot is None:
            if not client_reply.is_positive:
                self._out.note("the MX refused our EHLO")
                self._relay.fail(client_reply, "upstream-refused")
                return
            self._state.on(On.SET_UP)
            self._relay.send_held()
        if not self._may_release:  # nothing will be kept: spare the work
            return
        if command is None or not client_reply.is_positive:
            self._hello = None
        else:
            self._hello = (hello_text(command), client_reply)

    def cut(self) -> None:
        """The connection was closed after a message we refused: the next command for
        the MX dials a new one, set up by us (``need_link``)."""
        self._state.on(On.CUT)
        self._keep.fresh()

    def reachable(self) -> bool:
        return self._state.link is not Link.GONE  # NONE: dialled again when needed

    def idle_answer(self, command: Command) -> bool:
        """Without a connection (after ``cut``) RSET, NOOP... need none: answered here."""
        if self._state.link is not Link.NONE or command.verb not in IDLE_ANSWERS:
            return False
        if command.verb == "RSET":
            self._out.abort_transaction()
        self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
        self._relay.local(IDLE_ANSWERS[command.verb])
        return True

    def need_link(self) -> None:
        """A command waits for the MX after ``cut``: dial again; our own set-up follows."""
        state = self._state
        if state.link in (Link.DIALLING, Link.SETUP, Link.HANDSHAKE):
            return  # dialled already: the held commands go out once it is set up
        if state.link is not Link.NONE:
            raise IllegalMove(f"a dedicated link is {state.link.value}, never waited for")
        self._out.note(f"connecting to {self._destination} again for the next transaction")
        self._out.account.tls = None  # a new connection: in plaintext until its STARTTLS
        state.awaiting.append(Sent(Await.GREETING))
        state.on(On.DIALLED)
        self._out.add(act.ConnectServer())

    def after_reply(self) -> None:
        """The connection is the session's to the end."""

    def granted(self, hello_name: str | None = None) -> None:
        raise IllegalMove("a dedicated link is not granted")

    def reused(self, upstream: act.ReusedUpstream) -> None:
        raise IllegalMove("a dedicated link is not granted")

    def connected(self) -> None:
        awaiting = self._state.awaiting
        ours = bool(awaiting) and awaiting[0].slot is None  # dialled again: we set it up
        self._state.on(On.CONNECTED_FOR_US if ours else On.CONNECTED_FOR_CLIENT)

    def greeting(self, sent: Sent, reply: Reply) -> bool:
        """The client's greeting (False), or our own set-up's after ``cut``."""
        if sent.slot is not None:
            return False  # the client drives the set-up of the first connection
        if reply.code != 220:
            self._out.line(Direction.SERVER_TO_PROXY, reply.transcript())
            self._out.note("the MX refused the connection")
            self._relay.fail(reply, "upstream-refused")
            return True
        if self._may_release:
            self._greeting = reply
        send_hello(self._state, self._out, self._setup_hello())
        return True

    def _setup_hello(self) -> Command:
        return self._client_hello or default_hello(self._host)

    def lost_before_use(self, reason: str) -> bool:
        return False  # nothing to wait for: the session has no other connection coming

    def spent(self, sent: Sent, reply: Reply) -> bool:
        return False  # the session's own connection: its client hears the 421

    def wait_ran_out(self, text: str | None = None) -> None:
        raise IllegalMove("a dedicated link is never waited for")

    def quit(self, command: Command) -> bool:
        """QUIT: keep the MX connection for a later session if it is idle and known good;
        after ``cut`` (no connection) answered here."""
        state, greeting, memo = self._state, self._greeting, self._hello
        if state.link is Link.NONE and not state.held:
            self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self._relay.local(BYE, close="quit")
            return True
        if (
            not self._may_release
            or state.link is not Link.OPEN
            or greeting is None
            or memo is None
            or state.owed
            or state.awaiting
            or self._out.account.transaction is not None
            or state.message is not Message.NONE
            or state.draining
            or state.stage is not Stage.COMMANDS
        ):
            return False
        why_not = self._keep.verdict()
        if why_not is not None:
            self._out.note(f"upstream connection not kept: {why_not}")
            return False
        self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
        self._out.note("upstream connection kept for reuse")
        state.on(On.GONE)
        memo_state = act.UpstreamState(greeting, memo[0], memo[1], self._out.account.tls)
        self._out.add(act.ReleaseServer(memo_state))
        self._relay.local(BYE, close="quit")
        return True
