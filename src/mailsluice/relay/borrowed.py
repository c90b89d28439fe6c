"""Late binding (pure): the session borrows an MX connection per transaction.

With fair sharing, a session does not own an MX connection from its first byte. The
destination's connections are shared by its tenants through the shell's scheduler; a
session asks for one (``AcquireServer``) only when a transaction needs it, and hands it
back (``ReleaseServer``) as soon as the transaction is over:

* **greeting and EHLO from memory.** What the destination said before (its greeting,
  its EHLO reply as the client sees it: ``cached``) greets the client and answers its
  EHLO at once, with no connection. The first session to a destination (nothing in
  memory) asks for a connection at once and the client drives its set-up, as without
  late binding; what the MX says becomes the memory.
* **a transaction waits for a slot.** At MAIL FROM (or any command for the MX) the
  relay asks; MAIL, and what the client pipelines after it, wait in ``held`` (the client
  waits for MAIL's reply, which RFC 5321 lets take 5 minutes) until the shell hands an
  idle connection of the tenant (``ServerReused``) or dials a new one (``ServerGranted``,
  ``ServerConnected``). After ``hold_max`` without one: ``451 4.4.5`` to what waits.
* **our own set-up.** A new connection gets the MX's greeting, the client's EHLO (or
  HELO) name, STARTTLS when offered (``upgrade``), and EHLO again, all ours; then the
  held commands go out. A reused one is ready (or gets the EHLO again, when the client
  used another name). When the shell dials from a configured source address, the EHLO
  of our set-up says that address's name (``ServerGranted.hello_name``,
  ``ReusedUpstream.hello_name``: its PTR name) instead of the client's; the shell may
  choose that address by the transaction's sender (``AcquireServer.sender``).
* **capacity refusals are ours.** A greeting that says the MX has too many of our
  connections (``capacity_refusal``: at a set-up of ours, or at a first contact, whose
  client then keeps waiting for its greeting), a failed dial, or a connection lost
  during the set-up (or before a first contact's greeting) is ``Requeue``: the shell
  judges (others of ours up: capacity), learns the limit and puts the transaction back
  in line; the tenant never sees it. When the shell will not (nothing of ours is up),
  ``ServerConnectFailed`` follows: ``421 4.4.1``. Every other reply of the MX reaches
  the client unchanged.

The rule that never bends is untouched: the client's 2xx to end-of-data is still the
MX's 2xx, relayed as it came.
"""

from __future__ import annotations

import re

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

__all__ = ["BorrowedLease"]

_WAIT_RAN_OUT = Reply.make(
    451, "4.4.5", "Error: every connection this MX allows us is in use, try again later"
)


class BorrowedLease:
    """A connection per transaction, from the destination's fair share."""

    __slots__ = ("_capacity", "_destination", "_greeting", "_hello", "_host", "_keep",
                 "_link_hello", "_memo", "_out", "_relay", "_source_hello",
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
        cached: act.UpstreamState | None,
        capacity: re.Pattern[str] | None,
    ) -> None:
        self._state = state
        self._keep = keep  # what the MX has shown of the link (``keep``)
        self._out = out
        self._relay = relay
        self._destination = destination
        self._host = hostname
        self._capacity = capacity
        self._memo = cached  # the destination's greeting and EHLO reply, as last heard
        self._greeting: Reply | None = cached.greeting if cached else None  # of the link
        self._hello: Command | None = None  # the client's last EHLO/HELO: what a set-up says
        self._link_hello: str | None = None  # what the current link was told ("EHLO name")
        self._source_hello: str | None = None  # the link's source address's EHLO name

    # ------------------------------------------------------------------ the session
    def start(self) -> None:
        state, memo = self._state, self._memo
        if memo is None:  # first contact: a connection now; the client drives its set-up
            slot = Slot(Owed.GREETING)
            state.owed.append(slot)
            state.awaiting.append(Sent(Await.GREETING, slot))
            self._want()
            return
        state.on(On.GREETED)
        self._out.note(f"greeted from {self._destination}'s last answer; a connection is "
                       "taken when a transaction needs one")  # fmt: skip
        self._out.to_client(memo.greeting, Direction.PROXY_TO_CLIENT)

    def hello(self, command: Command) -> bool:
        self._hello = command
        memo = self._memo
        if self._state.link is Link.OPEN or memo is None:
            return False  # a connection is held (or nothing is known yet): the MX answers
        out = self._out
        out.abort_transaction()
        out.account.helo = address_text(command.argument)
        out.client_line(command.line, Direction.CLIENT_TO_PROXY)
        if command.verb == "EHLO":
            reply = memo.hello_reply
        else:  # HELO: the greeting line of the capability list, alone
            reply = Reply(memo.hello_reply.code, memo.hello_reply.lines[:1])
        self._relay.local(reply, hello=command)
        return True

    def reachable(self) -> bool:
        return self._state.link is not Link.GONE

    def idle_answer(self, command: Command) -> bool:
        """A command that needs no connection while none is held: answered here."""
        if self._state.link is not Link.NONE or command.verb not in IDLE_ANSWERS:
            return False
        if command.verb == "RSET":
            self._out.abort_transaction()
        self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
        self._relay.local(IDLE_ANSWERS[command.verb])
        return True

    def quit(self, command: Command) -> bool:
        """QUIT: answered here when no connection is held. A connection just done with
        its transaction (the QUIT came behind the dot, as Postfix and Exim send it) goes
        back first, so it stays for the tenant instead of hearing QUIT."""
        self.after_reply()
        if self._state.link is not Link.NONE:
            return False  # held behind a transaction, or sent on the connection it has
        self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
        self._relay.local(BYE, close="quit")
        return True

    def need_link(self) -> None:
        if self._state.link is Link.NONE:
            self._want()

    def _want(self) -> None:
        self._state.on(On.ASKED)
        txn = self._out.account.transaction
        if txn is None:
            self._out.add(act.AcquireServer())
        else:
            first = txn.rcpt_to[0] if txn.rcpt_to else ""
            self._out.add(act.AcquireServer(txn.mail_from, first))

    # ------------------------------------------------------------------ the link
    def granted(self, hello_name: str | None = None) -> None:
        self._source_hello = hello_name
        state = self._state
        state.on(On.GRANTED)
        self._keep.fresh()
        self._out.account.tls = None  # a new connection: in plaintext until its STARTTLS
        if not state.awaiting:  # ours to set up (at first contact the client's greeting)
            state.awaiting.append(Sent(Await.GREETING))

    def connected(self) -> None:
        state = self._state
        client_drives = bool(state.awaiting) and state.awaiting[0].slot is not None
        state.on(On.CONNECTED_FOR_CLIENT if client_drives else On.CONNECTED_FOR_US)

    def reused(self, upstream: act.ReusedUpstream) -> None:
        memo = self._memo = upstream.state
        self._keep.fresh(upstream.sessions)
        self._state.pipelining = pipelines(memo)
        self._greeting = memo.greeting
        self._out.account.tls = memo.tls
        state = self._state
        waiting = state.awaiting[0] if state.awaiting else None
        if waiting is not None and waiting.what is Await.GREETING and waiting.slot is not None:
            # first contact that waited for a slot and got a connection already greeted:
            # the client gets that greeting (the MX's own, remembered)
            state.awaiting.popleft()
            slot = waiting.slot
            slot.reply, slot.direction = memo.greeting, Direction.PROXY_TO_CLIENT
            self._relay.flush()
        self._out.note(f"connection to {self._destination} from {upstream.source} "
                       f"(transaction {upstream.sessions + 1} on it)")  # fmt: skip
        self._link_hello = memo.hello
        self._source_hello = upstream.hello_name
        if (self._hello is None and upstream.hello_name is None) or (
            hello_text(self._setup_hello()) == memo.hello
        ):
            self._ready(On.REUSED)
        else:  # the client uses another name: the MX hears it first
            self._state.on(On.REUSED_TO_SET_UP)
            self._send_hello()

    def greeting(self, sent: Sent, reply: Reply) -> bool:
        if sent.slot is not None:  # first contact: the client waits for this greeting
            if not self._says_full(reply):
                return False  # the MX's answer: the client's, as it came
            self._out.line(Direction.SERVER_TO_PROXY, reply.transcript())
            self._state.awaiting.appendleft(sent)  # still owed: from the next connection
            self._requeue(f"the MX has too many of our connections: {reply.transcript()}",
                          capacity=True)  # fmt: skip
            return True
        if reply.code == 220:  # our own set-up's
            self._greeting = reply
            self._send_hello()
            return True
        self._out.line(Direction.SERVER_TO_PROXY, reply.transcript())
        if self._says_full(reply):
            reason = f"the MX has too many of our connections: {reply.transcript()}"
            self._requeue(reason, capacity=True)
            return True
        self._out.note("the MX refused the connection")
        self._relay.fail(reply, "upstream-refused")
        return True

    def _says_full(self, reply: Reply) -> bool:
        """A capacity refusal: the MX has too many connections of ours."""
        capacity = self._capacity
        return reply.is_transient and capacity is not None and bool(capacity.search(reply.text))

    def lost_before_use(self, reason: str) -> bool:
        link = self._state.link
        if link is Link.SETUP:
            what = "connection lost during its set-up"
        elif link is Link.DIALLING:
            what = "the connect failed"
        elif link is Link.OPEN and self._first_contact_waits():
            what = "connection lost before its greeting"
        else:
            return False  # in use, or the shell already said it will not wait again
        self._requeue(f"{what}: {reason}", capacity=False)
        return True

    def _first_contact_waits(self) -> bool:
        """A first contact whose client still waits for the MX's greeting."""
        awaiting = self._state.awaiting
        head = awaiting[0] if awaiting else None
        return head is not None and head.what is Await.GREETING and head.slot is not None

    def _requeue(self, reason: str, *, capacity: bool) -> None:
        state = self._state
        self._out.note(f"{reason}; the transaction waits for a connection again")
        first = state.awaiting[0] if self._first_contact_waits() else None
        state.awaiting.clear()  # only our own set-up was out: the held commands wait on
        if first is not None:  # the client's greeting comes from the next connection
            first.timeout = None
            state.awaiting.append(first)
        state.on(On.REQUEUED)
        self._out.add(act.Requeue(reason, capacity))

    def _setup_hello(self) -> Command:
        """What our own set-up says: the source address's name, else the client's."""
        if self._source_hello is not None:
            return default_hello(self._source_hello)
        return self._hello or default_hello(self._host)

    def _send_hello(self) -> None:
        hello = self._setup_hello()
        self._link_hello = hello_text(hello)
        send_hello(self._state, self._out, hello)

    def remember_greeting(self, reply: Reply) -> None:
        """First contact: the MX's greeting reached the client."""
        self._greeting = reply if reply.code == 220 else None

    def remember_hello(self, slot: Slot | None, client_reply: Reply) -> None:
        greeting = self._greeting
        command = slot.command if slot is not None else self._setup_hello()
        if slot is not None:  # the client's own EHLO, relayed (first contact, or a new one)
            self._link_hello = hello_text(command) if command is not None else None
        if client_reply.is_positive and greeting is not None and self._link_hello is not None:
            self._memo = act.UpstreamState(
                greeting, self._link_hello, client_reply, self._out.account.tls
            )
        if slot is None:  # our own set-up is done
            if client_reply.is_positive:
                self._ready()
            else:
                self._out.note("the MX refused our EHLO")
                self._relay.fail(client_reply, "upstream-refused")

    def _ready(self, cause: On = On.SET_UP) -> None:
        """The link is set up (``cause``: by us, or a kept connection was ready): the held
        commands go out, in order."""
        self._state.on(cause)
        self._relay.send_held()

    def after_reply(self) -> None:
        """Hand the connection back once it is idle: no transaction, nothing out or held."""
        state = self._state
        memo = self._memo
        if (
            state.link is not Link.OPEN
            or state.awaiting
            or state.held
            or state.stage is not Stage.COMMANDS
            or state.message is not Message.NONE
            or self._out.account.transaction is not None
            or memo is None
        ):
            return
        state.on(On.RELEASED)
        why_not = self._keep.verdict()
        if why_not is not None:
            self._out.note(f"the connection is closed, not kept: {why_not}")
        self._out.add(act.ReleaseServer(memo, keep=why_not is None))

    def spent(self, sent: Sent, reply: Reply) -> bool:
        """A 421 to MAIL on a connection that carried transactions before (Exim's per
        connection limit, an MX ending long sessions): that connection is done, not this
        transaction, which goes back in line for another, unseen by the tenant. On a
        connection's first transaction the 421 is the client's."""
        state = self._state
        if sent.what is not Await.MAIL or self._keep.carried < 1 or sent.slot is None:
            return False
        self._out.line(Direction.SERVER_TO_PROXY, reply.transcript())
        self._out.note(
            f"the MX ends this connection after {self._keep.carried} transactions; "
            "the transaction waits for another"
        )
        back = [sent, *state.awaiting]
        state.awaiting.clear()
        for entry in reversed(back):
            command = entry.slot.command if entry.slot is not None else entry.command
            assert command is not None
            state.held.appendleft((command, entry))
        self._relay.cut_server()
        self._want()
        return True

    def cut(self) -> None:
        """The link was closed after a message we refused (the shell frees its slot):
        the next transaction asks for a connection like any other."""
        self._state.on(On.CUT)
        self._link_hello = None

    def wait_ran_out(self, text: str | None = None) -> None:
        """No slot within ``hold_max``: 451 4.4.5 to what waits; the session goes on.
        ``text``: the scheduler declined at once (a suspended destination), and says why."""
        state, out = self._state, self._out
        refusal = _WAIT_RAN_OUT if text is None else Reply.make(451, "4.4.5", text)
        if text is None:
            out.note(f"no connection to {self._destination} within the wait: 451 4.4.5")
        else:
            out.note(f"no connection to {self._destination} now: 451 4.4.5 {text}")
        out.add(act.CancelAcquire())
        state.on(On.WAIT_RAN_OUT)
        if state.awaiting and state.awaiting[0].what is Await.GREETING:  # first contact
            state.awaiting.clear()
            self._relay.fail(refusal, "destination-busy")
            return
        while state.held:
            command, sent = state.held.popleft()
            slot = sent.slot
            assert slot is not None
            reply = BYE if command.verb == "QUIT" else IDLE_ANSWERS.get(command.verb)
            if reply is None or command.verb in ("VRFY", "EXPN", "HELP"):
                reply = refusal
            slot.kind, slot.reply, slot.direction = Owed.PLAIN, reply, Direction.PROXY_TO_CLIENT
            if command.verb == "QUIT":
                slot.close = "quit"
        out.transaction_ended("deferred", refusal)
        self._relay.flush()
