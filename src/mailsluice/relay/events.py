"""Events the I/O shell feeds into the relay (facts that happened). Pure values."""

from __future__ import annotations

from dataclasses import dataclass

from mailsluice.relay.actions import ReusedUpstream
from mailsluice.smtp.replies import Reply


@dataclass(frozen=True, slots=True)
class ClientData:
    data: bytes


@dataclass(frozen=True, slots=True)
class ClientEof:
    """The client half-closed: it will send nothing more, but still reads our replies.

    Not a lost connection: every reply it is owed (end-of-data, a pipelined QUIT...) is
    still relayed from the MX and written to it; then the session ends (Exim sends
    ``.`` and ``QUIT`` in one write and shuts down its sending side)."""


@dataclass(frozen=True, slots=True)
class ClientClosed:
    """The client connection is gone (reset, or our writes cannot reach it)."""


@dataclass(frozen=True, slots=True)
class ServerConnected:
    source: str  # our local address toward the MX, "ip:port"


@dataclass(frozen=True, slots=True)
class ServerGranted:
    """Late binding: a slot of the destination is ours; the shell is dialling.
    ``hello_name``: the EHLO name of the source address it dials from (its PTR name), said
    in the set-up the relay makes itself; None: the client's own EHLO name."""

    hello_name: str | None = None


@dataclass(frozen=True, slots=True)
class ServerReused:
    """Late binding: an idle MX connection of this tenant is ours (after its EHLO)."""

    upstream: ReusedUpstream

    # written out: compiled by mypyc, unlike the dataclass's own (issue 25; kept equal to it
    # by tests/unit/test_hot_dataclasses.py)
    def __init__(self, upstream: ReusedUpstream) -> None:
        object.__setattr__(self, "upstream", upstream)


@dataclass(frozen=True, slots=True)
class ServerConnectFailed:
    reason: str


@dataclass(frozen=True, slots=True)
class ServerDeclined:
    """Late binding: no slot will come now (the destination is suspended after a
    deferral): what waits gets ``451 4.4.5`` with ``text`` at once, not at ``hold_max``."""

    text: str


@dataclass(frozen=True, slots=True)
class ServerData:
    data: bytes


@dataclass(frozen=True, slots=True)
class ServerClosed:
    reason: str


@dataclass(frozen=True, slots=True)
class TlsStarted:
    version: str
    cipher: str
    verified: bool
    resumed: bool = False  # an earlier TLS session with this MX, resumed


@dataclass(frozen=True, slots=True)
class TlsFailed:
    reason: str


@dataclass(frozen=True, slots=True)
class TlsPolicyChecked:
    """The answer to ``CheckTlsPolicy``: ``ok`` lets the recipient go to the MX;
    otherwise ``reply`` (a 4xx) answers it. ``note`` is the decision, for the transcript."""

    domain: str
    ok: bool
    reply: Reply | None
    note: str


@dataclass(frozen=True, slots=True)
class ClientTlsStarted:
    """The client leg's handshake succeeded (answers ``StartClientTls``)."""

    version: str  # e.g. "TLSv1.3"
    cipher: str  # e.g. "TLS_AES_256_GCM_SHA384"


@dataclass(frozen=True, slots=True)
class ClientTlsFailed:
    """The client leg's handshake failed or timed out: nothing can be said to the client
    (its connection is neither plaintext nor TLS any more); the session ends."""

    reason: str


@dataclass(frozen=True, slots=True)
class TimerExpired:
    """The deadline set by the last ``SetTimer`` passed."""


@dataclass(frozen=True, slots=True)
class ShutdownRequested:
    """Finish the transaction in flight, then say goodbye (SIGTERM)."""


@dataclass(frozen=True, slots=True)
class ShutdownForced:
    """The grace period is over: end the session now, with a 4xx if anything is open."""


@dataclass(frozen=True, slots=True)
class Aborted:
    """The operator ended the session (``mailsluice ctl abort``): a 4xx now, as for a
    forced shutdown, that says so; never after a 2xx the MX did not give."""


@dataclass(frozen=True, slots=True)
class InternalError:
    """The shell hit a bug of ours: end the session with a 4xx so the client retries."""

    detail: str


@dataclass(frozen=True, slots=True)
class FilterDecided:
    """The filters' verdict on the message taken in filter mode (answers ``RunFilters``).

    ``reject`` None: relay the message (the shell has it ready for ``SendSpooled``, edited
    or not). Otherwise the reply for the client: a 4xx or 5xx code and one line of text
    starting with its enhanced status code (the filter chain guarantees both).
    """

    reject: tuple[int, str] | None
    decided_by: str = ""  # the filter that decided, for the transcript


Event = (
    ClientData
    | ClientEof
    | ClientClosed
    | ServerConnected
    | ServerGranted
    | ServerReused
    | ServerConnectFailed
    | ServerDeclined
    | ServerData
    | ServerClosed
    | TlsStarted
    | TlsFailed
    | TlsPolicyChecked
    | ClientTlsStarted
    | ClientTlsFailed
    | TimerExpired
    | ShutdownRequested
    | ShutdownForced
    | Aborted
    | InternalError
    | FilterDecided
)
