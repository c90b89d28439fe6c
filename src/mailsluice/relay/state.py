"""Everything that decides what the relay does next: its stages and their legal moves.

h11's rule: all of a state machine's state and every legal transition in one module.
The relay's state has five independent parts, each an enum; what moves them is one table,
``MOVES``, keyed by the cause (``On``: a fact or decision, such as ``GO_AHEAD``, the 354
reaching the client, which starts the body and the message at once), with the moves each
cause makes, from where to where. ``RelayState.on(cause)`` makes them; a cause met in a
state it has no move from is a bug of ours (``IllegalMove``, which the shell turns into
``421 4.3.0`` for that session). The parts:

* ``Stage``, the session's main line: opening (the client has no greeting yet),
  commands, a message body arriving, closed;
* ``Input``, the client's input: open, discarded (it broke the pipelining rules), or
  ended (it half-closed and reads on);
* ``Link``, the MX connection: none, wanted (late binding: waiting for a slot),
  dialling, set up by us (late binding), open, in the TLS handshake, gone;
* ``Message``, the message of the transaction under way: none, its body arriving, or
  judged by the filters (filter mode);
* ``ClientTls``, the client leg's STARTTLS (RFC 3207): not offered, offered in
  plaintext, the handshake under way (nothing is read from the client), in TLS with no
  EHLO since (the client must say EHLO again), in TLS.

Beside them, two queues hold the conversation:

* ``owed``: one ``Slot`` per reply the client is owed, in the order of its commands
  (RFC 2920). A slot is filled by the MX's reply or by one of ours, and leaves only from
  the head, so pipelined replies can never be shifted onto another command. What a reply
  does when it reaches the client depends on the slot's ``Owed`` kind.
* ``awaiting``: one ``Sent`` per command sent to the MX whose reply has not come, in
  order; a forwarded command fills its client slot, the proxy's own (STARTTLS, the EHLO
  after TLS, keepalives, QUIT, a late set-up's greeting and EHLO) fill none. What an MX
  reply does when it arrives depends on the ``Await`` kind. With late binding, commands
  wait in ``held`` until the link is ready.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Final

from mailsluice.relay.records import CloseReason, Direction
from mailsluice.smtp.commands import Command
from mailsluice.smtp.replies import Reply
from mailsluice.smtp.verp import VerpRequest


class IllegalMove(Exception):  # not RuntimeError: mypyc compiles only a few bases
    """A transition the tables below do not allow: a bug of ours, never the peers'."""


class Stage(enum.Enum):
    OPENING = "opening"  # the client has not had its greeting yet
    COMMANDS = "commands"  # reading client commands, relaying replies
    BODY = "body"  # a message body is arriving from the client
    CLOSED = "closed"


class Input(enum.Enum):
    OPEN = "open"
    DISCARDED = "discarded"  # it broke the pipelining rules: nothing more is read
    ENDED = "ended"  # it half-closed: nothing more comes, it still reads our replies


class Link(enum.Enum):
    NONE = "none"  # no MX connection: not asked for yet, or handed back (late binding)
    WANTED = "wanted"  # late binding: asked for one (AcquireServer), waiting for a slot
    DIALLING = "dialling"  # being dialled
    SETUP = "setup"  # late binding: connected; our own greeting/EHLO/STARTTLS under way
    OPEN = "open"  # ready: commands can be written, replies read
    HANDSHAKE = "handshake"  # the TLS handshake: nothing is written or read
    GONE = "gone"  # closed or lost for good: never used again by this session


class Message(enum.Enum):
    NONE = "none"
    BODY = "body"  # its body is arriving
    JUDGED = "judged"  # filter mode: complete, the filters' verdict is awaited


class ClientTls(enum.Enum):
    """The client leg's TLS (the tenants' STARTTLS)."""

    NONE = "none"  # not offered to this client (client_tls off)
    PLAIN = "plain"  # offered, the client is in plaintext
    HANDSHAKE = "handshake"  # 220 sent: the shell upgrades; nothing is read meanwhile
    FRESH = "fresh"  # in TLS; the client has not said EHLO/HELO since (RFC 3207 §4.2)
    SECURE = "secure"  # in TLS, after a new EHLO/HELO


class On(enum.Enum):
    """What moves the relay's state: each fact or decision that changes a part of it."""

    GREETED = "greeted"  # the client has its greeting (the MX's, or one from memory)
    GO_AHEAD = "go-ahead"  # a 354 reached the client: the body comes
    MESSAGE_ENDED = "message-ended"  # its end of data (or the body refused at its end)
    SPOOLED = "spooled"  # filter mode: the message is whole, the filters judge it
    JUDGED = "judged"  # filter mode: the filters' verdict is in
    CLOSED = "closed"  # the session ended
    CLIENT_EOF = "client-eof"  # the client half-closed
    SYNC_VIOLATION = "sync-violation"  # it broke the pipelining rules: nothing more is read
    CLIENT_STARTTLS = "client-starttls"  # our 220 to its STARTTLS went out
    CLIENT_TLS_UP = "client-tls-up"  # its handshake is done
    CLIENT_HELLO = "client-hello"  # its EHLO/HELO after the handshake
    DIALLED = "dialled"  # a connection is dialled for the session (dedicated)
    ASKED = "asked"  # late binding: the transaction asks for a connection
    GRANTED = "granted"  # late binding: a slot, the shell dials
    CONNECTED_FOR_CLIENT = "connected-for-client"  # dialled, the client drives its set-up
    CONNECTED_FOR_US = "connected-for-us"  # dialled, the proxy sets it up itself
    REUSED = "reused"  # a kept connection, ready (its greeting and EHLO said before)
    REUSED_TO_SET_UP = "reused-to-set-up"  # a kept connection that must hear EHLO first
    SET_UP = "set-up"  # our own set-up is done: the held commands may go
    STARTTLS_ACCEPTED = "starttls-accepted"  # the MX's 220 to our STARTTLS: the handshake
    TLS_FOR_CLIENT = "tls-for-client"  # the handshake is done, the client's EHLO goes again
    TLS_FOR_US = "tls-for-us"  # the handshake is done, in our own set-up
    RELEASED = "released"  # late binding: the transaction gave the connection back
    CUT = "cut"  # closed in the middle of a message we refused; another comes later
    REQUEUED = "requeued"  # refused before use: back in line for another
    WAIT_RAN_OUT = "wait-ran-out"  # no connection within hold_max (or declined)
    GONE = "gone"  # closed, lost or handed back for good


_ALIVE = (Link.NONE, Link.WANTED, Link.DIALLING, Link.SETUP, Link.OPEN, Link.HANDSHAKE)

#: Every legal move, by what causes it: the one table that says what moves the stage, the
#: input, the link, the message and the client's TLS (h11's ``_state.py``). For each cause,
#: the moves it makes, from where to where; a cause met in a state it has no move from is a
#: bug of ours (``IllegalMove``, ``421 4.3.0`` for that session).
MOVES: dict[On, tuple[tuple[enum.Enum, enum.Enum], ...]] = {
    # the session's main line, and the message
    On.GREETED: ((Stage.OPENING, Stage.COMMANDS),),
    On.GO_AHEAD: ((Stage.COMMANDS, Stage.BODY), (Message.NONE, Message.BODY)),
    On.MESSAGE_ENDED: ((Stage.BODY, Stage.COMMANDS), (Message.BODY, Message.NONE)),
    On.SPOOLED: ((Stage.BODY, Stage.COMMANDS), (Message.BODY, Message.JUDGED)),
    On.JUDGED: ((Message.JUDGED, Message.NONE),),
    On.CLOSED: tuple((stage, Stage.CLOSED) for stage in Stage if stage is not Stage.CLOSED),
    # the client's input
    On.CLIENT_EOF: ((Input.OPEN, Input.ENDED),),
    # what it sent before its end of stream may be refused too
    On.SYNC_VIOLATION: ((Input.OPEN, Input.DISCARDED), (Input.ENDED, Input.DISCARDED)),
    # the client's TLS (RFC 3207): a failed handshake ends the session; no TLS in TLS
    On.CLIENT_STARTTLS: ((ClientTls.PLAIN, ClientTls.HANDSHAKE),),
    On.CLIENT_TLS_UP: ((ClientTls.HANDSHAKE, ClientTls.FRESH),),
    On.CLIENT_HELLO: ((ClientTls.FRESH, ClientTls.SECURE),),
    # the MX link
    On.DIALLED: ((Link.NONE, Link.DIALLING),),
    On.ASKED: ((Link.NONE, Link.WANTED),),
    On.GRANTED: ((Link.WANTED, Link.DIALLING),),
    On.CONNECTED_FOR_CLIENT: ((Link.DIALLING, Link.OPEN),),
    On.CONNECTED_FOR_US: ((Link.DIALLING, Link.SETUP),),
    On.REUSED: ((Link.NONE, Link.OPEN), (Link.WANTED, Link.OPEN)),
    On.REUSED_TO_SET_UP: ((Link.WANTED, Link.SETUP),),
    On.SET_UP: ((Link.SETUP, Link.OPEN),),
    On.STARTTLS_ACCEPTED: ((Link.OPEN, Link.HANDSHAKE), (Link.SETUP, Link.HANDSHAKE)),
    On.TLS_FOR_CLIENT: ((Link.HANDSHAKE, Link.OPEN),),
    On.TLS_FOR_US: ((Link.HANDSHAKE, Link.SETUP),),
    On.RELEASED: ((Link.OPEN, Link.NONE),),
    On.CUT: ((Link.OPEN, Link.NONE),),
    On.REQUEUED: (
        (Link.DIALLING, Link.WANTED),
        (Link.SETUP, Link.WANTED),
        (Link.OPEN, Link.WANTED),
    ),
    On.WAIT_RAN_OUT: ((Link.WANTED, Link.NONE),),
    On.GONE: tuple((link, Link.GONE) for link in _ALIVE),
}

_PART = {Stage: "stage", Input: "input", Link: "link", Message: "message",
         ClientTls: "client_tls"}  # fmt: skip


def _by_part(
    moves: tuple[tuple[enum.Enum, enum.Enum], ...],
) -> tuple[tuple[str, dict[str, enum.Enum]], ...]:
    parts: dict[str, dict[str, enum.Enum]] = {}
    for old, new in moves:
        parts.setdefault(_PART[type(old)], {})[old._name_] = new
    return tuple(parts.items())


#: ``MOVES`` for ``RelayState.on``: by the cause's name, then by part, each part's moves by
#: the old state's name (names, not members: an Enum's ``__hash__`` is interpreted Python,
#: a str's is cached; issue 25)
_STEPS: Final = {cause._name_: _by_part(moves) for cause, moves in MOVES.items()}


class Owed(enum.Enum):
    """What a reply does when it reaches the client (the slot's kind)."""

    GREETING = "greeting"  # the MX's banner: commands may be read from now on
    HELLO = "hello"  # EHLO/HELO (the capability list, edited)
    MAIL = "mail"
    RCPT = "rcpt"
    DATA = "data"  # a 354 starts the body
    END_OF_DATA = "end-of-data"  # ends the transaction; the only way a 2xx for mail goes out
    QUIT = "quit"  # the session ends
    PLAIN = "plain"  # RSET, NOOP, VRFY, EXPN, HELP, and every reply of our own
    OUR_DATA = "our-data"  # filter mode: DATA answered by us, decided at the head
    STARTTLS = "starttls"  # our 220 to the client's STARTTLS: the handshake starts after it


class Await(enum.Enum):
    """What an MX reply is the answer to (the kind of the command sent)."""

    GREETING = "greeting"
    HELLO = "hello"  # the client's EHLO/HELO, or ours when it is repeated
    STARTTLS = "starttls"  # ours
    HELLO_AFTER_TLS = "hello-after-tls"  # ours; its reply is the client's
    MAIL = "mail"
    RCPT = "rcpt"
    DATA = "data"
    END_OF_DATA = "end-of-data"
    RSET = "rset"
    QUIT = "quit"
    OTHER = "other"  # NOOP, VRFY, EXPN, HELP
    KEEPALIVE = "keepalive"  # ours: NOOP while the filters run, RSET after a refusal
    FILTERED_DATA = "filtered-data"  # ours: DATA after the filters said "relay"
    VERP_MAIL = "verp-mail"  # XVERP: MAIL with the first recipient's return path; its
    # reply fills that RCPT's slot only if it is a refusal (``xverp``)


@dataclass(slots=True)
class Slot:
    """A reply the client is owed."""

    kind: Owed
    barrier: bool = False  # no further command is read until this reply is out
    command: Command | None = None
    reply: Reply | None = None  # None until known
    direction: Direction = Direction.SERVER_TO_CLIENT  # how it is logged when sent
    close: CloseReason | None = None  # the session ends once it is sent, for this reason

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(
        self,
        kind: Owed,
        barrier: bool = False,
        command: Command | None = None,
        reply: Reply | None = None,
        direction: Direction = Direction.SERVER_TO_CLIENT,
        close: CloseReason | None = None,
    ) -> None:
        self.kind = kind
        self.barrier = barrier
        self.command = command
        self.reply = reply
        self.direction = direction
        self.close = close


@dataclass(slots=True)
class Sent:
    """A command out to the MX whose reply has not come (or held until the link is
    ready, late binding)."""

    what: Await
    slot: Slot | None = None  # the client's slot this reply fills; None: ours
    command: Command | None = None  # ours in a late set-up: the EHLO/HELO to repeat
    fallback: Reply | None = None  # STARTTLS: the plaintext EHLO reply, if it is refused
    timeout: float | None = None  # seconds the MX has to answer (the relay works it out)

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(
        self,
        what: Await,
        slot: Slot | None = None,
        command: Command | None = None,
        fallback: Reply | None = None,
        timeout: float | None = None,
    ) -> None:
        self.what = what
        self.slot = slot
        self.command = command
        self.fallback = fallback
        self.timeout = timeout


@dataclass(slots=True)
class PolicyCheck:
    """A recipient waiting for its domain's TLS policy check (``tlscheck``)."""

    slot: Slot  # the RCPT's reply, owed as a barrier: nothing more is read meanwhile
    domain: str
    asked: bool = False  # CheckTlsPolicy is out (it waits for the link to be open)


@dataclass(slots=True)
class VerpTransaction:
    """A client transaction under XVERP (``xverp``): MAIL answered by us, one recipient.

    It lasts from the client's MAIL to what ends the transaction in the client's view
    (RSET, EHLO/HELO, the reply to end-of-data, a new MAIL): not to the log's end of it,
    which a deferral by us can reach earlier."""

    request: VerpRequest
    mail: Command  # the client's MAIL: its other parameters go upstream
    recipient: Slot | None = None  # the one RCPT that goes upstream (a barrier till answered)


class RelayState:
    """The relay's state (see the module docstring); every move is checked."""

    __slots__ = ("awaiting", "client_tls", "draining", "errors", "held", "input", "link",
                 "message", "mx_heard_at", "owed", "pipelining", "policy_check",
                 "policy_passed", "stage", "verp")  # fmt: skip

    def __init__(self, *, client_tls: bool = False) -> None:
        self.stage = Stage.OPENING
        self.client_tls = ClientTls.PLAIN if client_tls else ClientTls.NONE
        self.input = Input.OPEN
        self.link = Link.NONE
        self.message = Message.NONE
        self.draining = False  # shutdown asked: end once no transaction is open
        self.owed: deque[Slot] = deque()
        self.awaiting: deque[Sent] = deque()
        # client commands waiting for the MX link to be ready (late binding, a connection
        # dialled again), or, on a link without PIPELINING, for the reply before them
        self.held: deque[tuple[Command, Sent]] = deque()
        # the link offered PIPELINING in its EHLO reply: commands may go out before the
        # replies to those before them (RFC 2920); else one at a time (postscreen(8)
        # counts a client that pipelines without it as a bot)
        self.pipelining = True
        self.errors = 0  # local error replies so far
        self.mx_heard_at = 0.0  # the last exchange with the MX (filter mode's keepalive clock)
        # TLS policy: the recipient waiting for its domain's check, and the domains whose
        # policy this transaction's connection met (cleared at each MAIL)
        self.policy_check: PolicyCheck | None = None
        self.policy_passed: set[str] = set()
        self.verp: VerpTransaction | None = None  # the transaction under XVERP, if any

    # ------------------------------------------------------------- transitions
    def on(self, cause: On) -> None:
        """Make the moves ``cause`` makes (``MOVES``); any other is ``IllegalMove``."""
        for part, moves in _STEPS[cause._name_]:
            old = getattr(self, part)
            new = moves.get(old._name_)
            if new is None:
                raise IllegalMove(
                    f"{cause.value}: {type(old).__name__} {old.value} has no such move"
                )
            setattr(self, part, new)

    # ------------------------------------------------------------- the queues
    def blocked(self) -> bool:
        """A barrier is owed: no further client command is read until it is sent.

        Nothing is read after a barrier slot is owed, so while one is owed it is the
        last slot: looking at the tail is enough."""
        owed = self.owed
        return bool(owed) and owed[-1].barrier

    def first_unfilled(self) -> Slot | None:
        for slot in self.owed:
            if slot.reply is None:
                return slot
        return None

    def awaits(self, what: Await) -> bool:
        return any(sent.what is what for sent in self.awaiting)
