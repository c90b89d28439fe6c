"""The session's one deadline (pure): which timeout applies now, and what its expiry means.

``arm`` says which timer runs after every event (``SetTimer``): the reply the MX owes
(by what was sent: greeting, EHLO/STARTTLS, MAIL..., DATA, the dot, QUIT), the TLS
handshake, the wait for a slot (``hold_max``), the client mid-body, the filters' keepalive,
or the client's idleness; ``on_server`` says whose silence it measures. A completed client
line restarts the client's clock (``line_done``). ``expired`` turns the expiry into the
failure it is.
"""

from __future__ import annotations

from mailsluice.relay import actions as act
from mailsluice.relay.body import DataPhase
from mailsluice.relay.config import RelayConfig, Timeouts
from mailsluice.relay.endings import Endings
from mailsluice.relay.lease import Lease
from mailsluice.relay.outbox import Outbox
from mailsluice.relay.state import Await, Link, Message, RelayState, Stage
from mailsluice.relay.upgrade import TlsUpgrade
from mailsluice.smtp import replies as rp


class Timers:
    """The deadline of one session (see the module docstring)."""

    __slots__ = ("_armed", "_cfg", "_data", "_endings", "_host", "_lease", "_on_server",
                 "_out", "_seconds", "_state", "_upgrade", "line_done")  # fmt: skip

    def __init__(
        self,
        state: RelayState,
        out: Outbox,
        config: RelayConfig,
        *,
        endings: Endings,
        lease: Lease,
        upgrade: TlsUpgrade,
        data: DataPhase,
    ) -> None:
        self._state = state
        self._out = out
        self._cfg = config
        self._host = config.hostname
        self._endings = endings
        self._lease = lease
        self._upgrade = upgrade
        self._data = data
        # the last SetTimer (two plain fields: a tuple made, boxed and compared at every
        # event cost more than the rest of ``arm``)
        self._armed = False
        self._seconds = 0.0
        self._on_server = False
        self.line_done = False  # a client line completed: its timeout starts afresh

    def fired(self) -> None:
        """The shell's timer has fired: whatever runs next is a new timer."""
        self._armed = False

    def expired(self) -> None:
        state, out, host = self._state, self._out, self._host
        if state.link is Link.WANTED:
            self._lease.wait_ran_out()
        elif state.link is Link.HANDSHAKE:
            self._upgrade.broken("TLS handshake timed out")
        elif state.stage is Stage.BODY:
            out.note("client timeout in the middle of the message")
            self._endings.fail(rp.client_timeout(host), "client-timeout")
        elif state.awaiting:
            if state.awaits(Await.END_OF_DATA):
                out.note("timeout after end-of-data: the message may be delivered twice")
                self._endings.fail(rp.timeout_after_dot(host), "upstream-timeout")
            elif state.link is Link.DIALLING:
                self._endings.fail(rp.greeting_unreachable(host), "upstream-unreachable")
            else:
                self._endings.fail(rp.upstream_timeout(host), "upstream-timeout")
        elif state.message is Message.JUDGED:
            self._data.idle()
        else:
            self._endings.quit_upstream()
            self._endings.fail(rp.client_timeout(host), "client-timeout")

    def arm(self) -> None:
        """Announce the timeout that applies now, and whose silence it measures.

        The shell restarts it at every event from that side (``SetTimer.on_server``), so a
        client trickling bytes cannot keep a silent MX's deadline from expiring.
        """
        state = self._state
        link = state.link
        if link is Link.HANDSHAKE:
            seconds, on_server = self._cfg.timeouts.helo, True
        elif link is Link.WANTED:  # waiting for a slot of the destination
            seconds, on_server = self._cfg.timeouts.hold_max, True
        elif state.awaiting:
            head = state.awaiting[0]
            timeout = head.timeout
            if timeout is None:
                timeout = head.timeout = _reply_timeout(head.what, self._cfg.timeouts, link)
            seconds, on_server = timeout, True
        elif state.stage is Stage.BODY:
            seconds, on_server = self._cfg.timeouts.client_data, False
        elif state.message is Message.JUDGED:  # a NOOP keeps the idle MX with us
            seconds, on_server = self._cfg.filter_keepalive, False
        else:
            seconds, on_server = self._cfg.timeouts.client_idle, False
        # A completed client line restarts the client's clock: a command must arrive whole
        # within the timeout (the shell does not restart it for a partial line).
        if (
            not self._armed
            or seconds != self._seconds
            or on_server is not self._on_server
            or (self.line_done and not on_server)
        ):
            self._armed, self._seconds, self._on_server = True, seconds, on_server
            self._out.actions.append(act.SetTimer(seconds, on_server))
        self.line_done = False


def _reply_timeout(what: Await, t: Timeouts, link: Link) -> float:
    if what is Await.GREETING:
        return t.connect + t.greeting if link is Link.DIALLING else t.greeting
    if what is Await.HELLO or what is Await.STARTTLS or what is Await.HELLO_AFTER_TLS:
        return t.helo
    if what is Await.DATA:
        return t.data_init
    if what is Await.END_OF_DATA:
        return t.data_done
    if what is Await.QUIT:
        return t.quit
    return t.mail
