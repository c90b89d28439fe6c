"""Actions the relay asks the I/O shell to perform (imperatives). Pure values."""

from __future__ import annotations

from dataclasses import dataclass

from mailsluice.relay.records import Record
from mailsluice.smtp.replies import Reply


@dataclass(frozen=True, slots=True)
class SendToClient:
    data: bytes

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, data: bytes) -> None:
        object.__setattr__(self, "data", data)


@dataclass(frozen=True, slots=True)
class SendToServer:
    data: bytes

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, data: bytes) -> None:
        object.__setattr__(self, "data", data)


@dataclass(frozen=True, slots=True)
class ConnectServer:
    """Open the upstream connection (destination and source address come from the route)."""


@dataclass(frozen=True, slots=True)
class StartServerTls:
    """Upgrade the upstream connection to TLS now; answer with TlsStarted or TlsFailed."""


@dataclass(frozen=True, slots=True)
class StartClientTls:
    """Upgrade the client connection to TLS (server side) now, after writing what came
    before (the 220); read nothing from the client meanwhile. Answer with
    ``ClientTlsStarted`` or ``ClientTlsFailed``."""


@dataclass(frozen=True, slots=True)
class CloseServer:
    """Close the upstream connection now (aborts any MX transaction in progress)."""


@dataclass(frozen=True, slots=True)
class CloseClient:
    """Close the client connection once what was sent to it is flushed.

    ``linger``: half-close and drain the client's input first, so that a reset cannot
    destroy replies it has not read yet. Not needed after a clean QUIT with nothing
    unread (the client said goodbye and waits only for our 221)."""

    linger: bool = True

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, linger: bool = True) -> None:
        object.__setattr__(self, "linger", linger)


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Deliver TimerExpired once ``seconds`` pass with no data from the side waited on.

    The shell restarts the timeout at every data event from that side (the MX when
    ``on_server``, else the client); the relay sends SetTimer only when the timeout that
    applies, or the side, changes.
    """

    seconds: float
    on_server: bool

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, seconds: float, on_server: bool) -> None:
        object.__setattr__(self, "seconds", seconds)
        object.__setattr__(self, "on_server", on_server)


@dataclass(frozen=True, slots=True)
class Log:
    record: Record

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, record: Record) -> None:
        object.__setattr__(self, "record", record)


@dataclass(frozen=True, slots=True)
class TlsBroken:
    """TLS to this destination failed: remember it so the next attempt goes plaintext."""


@dataclass(frozen=True, slots=True)
class CheckTlsPolicy:
    """Does the MX connection meet ``domain``'s TLS policy? Answer ``TlsPolicyChecked``.

    Asked at a transaction's first recipient in ``domain``, once the link is open (the
    connection the recipient would go over is known); the recipient waits for it."""

    domain: str


@dataclass(frozen=True, slots=True)
class SpoolData:
    """Filter mode: keep these message bytes (canonical, dot-stuffing already removed)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class RunFilters:
    """Filter mode: the message is complete; run the filters, answer ``FilterDecided``."""

    transaction: int  # number of this transaction in the session, from 1
    mail_from: str
    rcpt_to: tuple[str, ...]  # the recipients the MX accepted
    mail_params: tuple[str, ...]
    helo: str | None


@dataclass(frozen=True, slots=True)
class SendSpooled:
    """Filter mode: the MX said 354; send the (filtered) message, dot-stuffed, then ".".

    The relay does not see these bytes; the reply to end-of-data is awaited as usual."""


@dataclass(frozen=True, slots=True)
class UpstreamState:
    """What a client of an open MX connection is told without asking the MX again: the
    MX's greeting, and the (client-facing) reply to the last EHLO or HELO."""

    greeting: Reply
    hello: str  # that command, as "EHLO name" or "HELO name"
    hello_reply: Reply
    tls: tuple[str, str, bool] | None  # version, cipher, verified; None = plaintext


@dataclass(frozen=True, slots=True)
class ReusedUpstream:
    """An idle MX connection handed to a new session (connection reuse, the shell's pool)."""

    state: UpstreamState
    source: str  # our end of it, "ip:port"
    sessions: int  # client sessions it has carried before this one
    hello_name: str | None = None  # late binding: the EHLO name of its source address

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(
        self, state: UpstreamState, source: str, sessions: int, hello_name: str | None = None
    ) -> None:
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "sessions", sessions)
        object.__setattr__(self, "hello_name", hello_name)


@dataclass(frozen=True, slots=True)
class ReleaseServer:
    """The upstream connection is idle, after EHLO, with no transaction, and the relay no
    longer owns it: keep it open for a later transaction (instead of QUIT), or, when
    ``keep`` is false (the MX showed it will not take mail on it: ``keep.KeepCheck``),
    close it politely (QUIT) and free its slot."""

    state: UpstreamState
    keep: bool = True

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, state: UpstreamState, keep: bool = True) -> None:
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "keep", keep)


@dataclass(frozen=True, slots=True)
class AcquireServer:
    """Late binding: the session needs an MX connection for a transaction. The shell
    answers when the destination has a slot for this tenant: ``ServerReused`` (an idle
    connection of the tenant's) or ``ServerGranted`` then ``ServerConnected`` (a new one),
    or ``ServerConnectFailed``. Until then the transaction waits (``hold_max``).
    ``sender``: the transaction's MAIL FROM address (as logged; "" before any MAIL), and
    ``recipient`` its first recipient when known yet (else ""): the shell may choose the
    source address by them (``[[source_rules]]``)."""

    sender: str = ""
    recipient: str = ""

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, sender: str = "", recipient: str = "") -> None:
        object.__setattr__(self, "sender", sender)
        object.__setattr__(self, "recipient", recipient)


@dataclass(frozen=True, slots=True)
class CancelAcquire:
    """Stop waiting for an MX connection (the wait ran out, or the session ended)."""


@dataclass(frozen=True, slots=True)
class Requeue:
    """The connection just given was refused before the transaction could use it (a 421
    greeting, a failed dial, a reset during set-up): close it; if the MX refused for
    capacity (it said so, or others of ours are up), learn its limit and put the
    transaction back in line, else answer ``ServerConnectFailed``."""

    reason: str
    capacity: bool  # the MX said so (a capacity greeting); else the shell judges


@dataclass(frozen=True, slots=True)
class MxDeferred:
    """The MX answered something with a 4xx (its text): for the destination's deferral
    counts and the responses its rules ask for (rate, reputation...)."""

    code: int
    text: str


@dataclass(frozen=True, slots=True)
class DropSpool:
    """Filter mode: the message will not be relayed; forget what was spooled."""


Action = (
    SendToClient
    | SendToServer
    | ConnectServer
    | StartServerTls
    | StartClientTls
    | CloseServer
    | CloseClient
    | SetTimer
    | Log
    | TlsBroken
    | CheckTlsPolicy
    | SpoolData
    | RunFilters
    | SendSpooled
    | DropSpool
    | ReleaseServer
    | AcquireServer
    | CancelAcquire
    | Requeue
    | MxDeferred
)
