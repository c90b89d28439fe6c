"""Everything that decides what the relay does next: its stages and their legal moves.

h11's rule: all of a state machine's state and every legal transition in one module.
The relay's state has five independent parts, each an enum with a table of the moves
it may make (any other move is a bug of ours: ``IllegalMove``, which the shell turns
into ``421 4.3.0`` for that session):

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

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


_E = TypeVar("_E", bound=enum.Enum)

_STAGE_MOVES = {
    Stage.OPENING: frozenset({Stage.COMMANDS, Stage.CLOSED}),
    Stage.COMMANDS: frozenset({Stage.BODY, Stage.CLOSED}),
    Stage.BODY: frozenset({Stage.COMMANDS, Stage.CLOSED}),
    Stage.CLOSED: frozenset(),
}
_INPUT_MOVES = {
    Input.OPEN: frozenset({Input.DISCARDED, Input.ENDED}),
    Input.ENDED: frozenset({Input.DISCARDED}),  # what it sent before its end is refused
    Input.DISCARDED: frozenset(),  # its end of stream changes nothing then
}
_LINK_MOVES = {
    # OPEN: a reused connection; WANTED: late binding asks for one
    Link.NONE: frozenset({Link.WANTED, Link.DIALLING, Link.OPEN, Link.GONE}),
    # granted: dialled, or an idle one (ready, or after a new EHLO); NONE: the wait ran out
    Link.WANTED: frozenset({Link.DIALLING, Link.SETUP, Link.OPEN, Link.NONE, Link.GONE}),
    # OPEN: the client drives the set-up; SETUP: we do; WANTED: refused, back in line
    Link.DIALLING: frozenset({Link.OPEN, Link.SETUP, Link.WANTED, Link.GONE}),
    Link.SETUP: frozenset({Link.OPEN, Link.HANDSHAKE, Link.WANTED, Link.GONE}),
    # NONE: handed back; WANTED: refused at a first contact's greeting, back in line
    Link.OPEN: frozenset({Link.HANDSHAKE, Link.NONE, Link.WANTED, Link.GONE}),
    Link.HANDSHAKE: frozenset({Link.OPEN, Link.SETUP, Link.GONE}),
    Link.GONE: frozenset(),
}
_CLIENT_TLS_MOVES = {
    ClientTls.NONE: frozenset(),
    ClientTls.PLAIN: frozenset({ClientTls.HANDSHAKE}),
    ClientTls.HANDSHAKE: frozenset({ClientTls.FRESH}),  # a failed handshake ends the session
    ClientTls.FRESH: frozenset({ClientTls.SECURE}),
    ClientTls.SECURE: frozenset(),  # never TLS inside TLS
}
_MESSAGE_MOVES = {
    Message.NONE: frozenset({Message.BODY}),
    Message.BODY: frozenset({Message.NONE, Message.JUDGED}),
    Message.JUDGED: frozenset({Message.NONE}),
}


def _pairs(table: Mapping[_E, frozenset[_E]]) -> frozenset[tuple[str, str]]:
    """Every legal move as a pair of values: checked without hashing enum members."""
    return frozenset((old.value, new.value) for old, news in table.items() for new in news)


_STAGE_PAIRS = _pairs(_STAGE_MOVES)
_INPUT_PAIRS = _pairs(_INPUT_MOVES)
_LINK_PAIRS = _pairs(_LINK_MOVES)
_MESSAGE_PAIRS = _pairs(_MESSAGE_MOVES)
_CLIENT_TLS_PAIRS = _pairs(_CLIENT_TLS_MOVES)


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


@dataclass(slots=True)
class Sent:
    """A command out to the MX whose reply has not come (or held until the link is
    ready, late binding)."""

    what: Await
    slot: Slot | None = None  # the client's slot this reply fills; None: ours
    command: Command | None = None  # ours in a late set-up: the EHLO/HELO to repeat
    fallback: Reply | None = None  # STARTTLS: the plaintext EHLO reply, if it is refused
    timeout: float | None = None  # seconds the MX has to answer (the relay works it out)


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
    def enter(self, stage: Stage) -> None:
        old = self.stage
        if stage is not old:
            if (old._value_, stage._value_) not in _STAGE_PAIRS:
                raise _illegal(old, stage)
            self.stage = stage

    def end_input(self, how: Input) -> None:
        old = self.input
        if how is not old:
            if (old._value_, how._value_) not in _INPUT_PAIRS:
                raise _illegal(old, how)
            self.input = how

    def move_link(self, link: Link) -> None:
        old = self.link
        if link is not old:
            if (old._value_, link._value_) not in _LINK_PAIRS:
                raise _illegal(old, link)
            self.link = link

    def move_message(self, message: Message) -> None:
        old = self.message
        if message is not old:
            if (old._value_, message._value_) not in _MESSAGE_PAIRS:
                raise _illegal(old, message)
            self.message = message

    def move_client_tls(self, tls: ClientTls) -> None:
        old = self.client_tls
        if tls is not old:
            if (old._value_, tls._value_) not in _CLIENT_TLS_PAIRS:
                raise _illegal(old, tls)
            self.client_tls = tls

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


def _illegal(old: enum.Enum, new: enum.Enum) -> IllegalMove:
    return IllegalMove(f"{type(old).__name__}: {old.value} -> {new.value} is not a legal move")
