"""The client's commands (pure): read in order, each answered here or sent to the MX.

``data`` takes the client's bytes (the body to the data phase; command lines to the
framer, nothing after a pipelining violation or during the client's TLS handshake);
``pump`` reads whole lines while no barrier is owed and the reply queue has room, and
decides for each: relayed (``Delivery.forward``), answered here (XVERP, STARTTLS, AUTH,
BDAT, HTTP, limits), held for the lease, or refused; too many local errors end the
session. Nothing is read after DATA until the MX's 354: a client that sends more gets
``554 5.5.0`` as DATA's reply (``_sync_violation``).
"""

from __future__ import annotations

from typing import Final

from mailsluice.relay.accounting import address_text
from mailsluice.relay.body import DataPhase
from mailsluice.relay.clienttls import ClientStartTls
from mailsluice.relay.config import RelayConfig
from mailsluice.relay.delivery import Delivery
from mailsluice.relay.endings import Endings
from mailsluice.relay.lease import Lease
from mailsluice.relay.outbox import Outbox
from mailsluice.relay.records import Direction
from mailsluice.relay.state import Await, ClientTls, Input, On, Owed, RelayState, Slot, Stage
from mailsluice.relay.tlscheck import PolicyChecks
from mailsluice.relay.xverp import Xverp
from mailsluice.smtp import replies as rp
from mailsluice.smtp.commands import (
    KNOWN_VERBS,
    Command,
    CommandError,
    looks_like_http,
    parse_command,
)
from mailsluice.smtp.lines import Line, LineFramer, LineTooLong
from mailsluice.smtp.replies import Reply

_FORWARDED: Final = {
    "MAIL": (Owed.MAIL, Await.MAIL), "RCPT": (Owed.RCPT, Await.RCPT),
    "RSET": (Owed.PLAIN, Await.RSET), "NOOP": (Owed.PLAIN, Await.OTHER),
    "VRFY": (Owed.PLAIN, Await.OTHER), "EXPN": (Owed.PLAIN, Await.OTHER),
    "HELP": (Owed.PLAIN, Await.OTHER),
}  # fmt: skip
_TAKES_UPSTREAM: Final = frozenset({"HELO", "EHLO", "MAIL", "RCPT", "DATA", "RSET", "NOOP",
                                    "VRFY", "EXPN", "HELP"})  # fmt: skip
_DATA_WAITS: Final = (Owed.DATA, Owed.OUR_DATA)  # DATA is out, its reply not yet given
_BYE = Reply.make(221, "2.0.0", "Bye")
_HANDSHAKE: Final = ClientTls.HANDSHAKE  # the client's TLS handshake (the hot path)


class ClientCommands:
    """The client's side of the session (see the module docstring)."""

    __slots__ = ("_cfg", "_client_tls", "_data", "_delivery", "_endings", "_forward", "_host",
                 "_lease", "_lines", "_local", "_out", "_policy", "_state", "_verp")  # fmt: skip

    def __init__(
        self,
        state: RelayState,
        out: Outbox,
        config: RelayConfig,
        *,
        delivery: Delivery,
        endings: Endings,
        lease: Lease,
        data: DataPhase,
        verp: Xverp,
        policy: PolicyChecks,
        client_tls: ClientStartTls,
        client_lines: LineFramer,
    ) -> None:
        self._state = state
        self._out = out
        self._cfg = config
        self._host = config.hostname
        self._delivery = delivery
        self._local = delivery.local  # a reply of ours, owed in order
        self._forward = delivery.forward  # a command relayed, its reply owed
        self._endings = endings
        self._lease = lease
        self._data = data
        self._verp = verp
        self._policy = policy
        self._client_tls = client_tls
        self._lines = client_lines

    def data(self, data: bytes) -> None:
        """The client's bytes: the body, or command lines to read (``pump``)."""
        state = self._state
        if state.stage is Stage.BODY:
            rest = self._data.body(data)
            if rest:
                self._lines.feed(rest)
            return
        if state.input is Input.DISCARDED:
            return  # the session ends once the replies owed are out
        if state.client_tls is _HANDSHAKE:  # plaintext after STARTTLS: never read
            self._client_tls.discard(len(data))
            return
        owed = state.owed
        if owed and owed[-1].kind in _DATA_WAITS and owed[-1].reply is None:
            self._sync_violation(owed[-1])  # DATA is a barrier: when waiting, it is last
            return
        self._lines.feed(data)

    def pump(self) -> bool:
        """Read and act on the client's next whole lines; True when one was completed (its
        timeout starts afresh)."""
        lines, state = self._lines, self._state
        done = False
        cap = self._cfg.max_in_flight  # bounds the FIFO; unread lines stay in the backlog
        commands, discarded = Stage.COMMANDS, Input.DISCARDED
        while (
            state.stage is commands
            and not (state.owed and state.owed[-1].barrier)  # ``RelayState.blocked``
            and state.input is not discarded
            and len(state.owed) < cap
        ):
            if lines.discarded > self._cfg.max_pending_input:
                self._endings.fail(
                    Reply.make(421, "4.7.0", f"{self._host} Error: line too long"), "flood"
                )
                return done
            item = lines.next_line()
            if item is None:
                return done
            done = True
            if isinstance(item, LineTooLong):
                self._error(Reply.make(500, "5.5.2", "Error: command line too long"))
                continue
            self._command(item)
        return done

    def _command(self, line: Line) -> None:
        out = self._out
        parsed = parse_command(line.content)
        # HTTP lines usually parse as (unknown) commands: they go before any error. A line
        # whose first word is an SMTP verb is never HTTP (not looked at: the hot path).
        if parsed.verb not in KNOWN_VERBS and looks_like_http(line.content):
            out.client_line(line.content, Direction.CLIENT_TO_PROXY)
            self._local(Reply.make(221, "2.7.0", "Error: I can break rules, too. Goodbye."),
                        close="closed-by-proxy")  # fmt: skip
            return
        if isinstance(parsed, CommandError):
            out.client_line(line.content, Direction.CLIENT_TO_PROXY)
            self._error(parsed.reply)
            return
        verb = parsed.verb
        if verb in _TAKES_UPSTREAM and not self._lease.reachable():
            out.client_line(line.content, Direction.CLIENT_TO_PROXY)
            self._local(rp.upstream_lost(self._host), close="closed-by-proxy")
        elif verb == "EHLO" or verb == "HELO":
            self._client_tls.hello()
            self._verp.end()
            if self._lease.hello(parsed):
                return
            out.abort_transaction()
            out.account.helo = address_text(parsed.argument)
            self._forward(parsed, Slot(Owed.HELLO, barrier=True, command=parsed), Await.HELLO)
        elif verb == "MAIL":
            self._mail(parsed)
        elif verb == "RCPT":
            self._rcpt(parsed)
        elif verb == "DATA":
            if self._lines.buffered:  # more bytes behind DATA: it did not wait for 354
                out.client_line(parsed.line, Direction.CLIENT_TO_PROXY)
                self._sync_violation(None)  # the MX never sees this DATA
            elif (refusal := self._verp.data_refusal()) is not None:
                out.client_line(parsed.line, Direction.CLIENT_TO_PROXY)
                self._error(refusal)
            else:
                self._data.command(parsed)
        elif verb in _FORWARDED:
            if verb == "RSET":
                self._verp.end()
            if self._lease.idle_answer(parsed):
                return
            if verb == "RSET":
                out.abort_transaction()
            owed, what = _FORWARDED[verb]
            self._forward(parsed, Slot(owed, command=parsed), what)
        elif verb == "QUIT":
            self._quit(parsed)
        elif verb == "STARTTLS":
            refusal = self._client_tls.command(parsed)
            if refusal is None:
                self._delivery.flush()
            else:
                self._error(refusal)
        elif verb == "BDAT":
            out.client_line(parsed.line, Direction.CLIENT_TO_PROXY)
            self._local(Reply.make(521, "5.5.1", "Error: command not implemented"),
                        close="closed-by-proxy")  # fmt: skip
        else:  # STARTTLS, AUTH, ETRN, XCLIENT, unknown verbs: answered here, in order
            out.client_line(b"AUTH ****" if verb == "AUTH" else parsed.line,
                            Direction.CLIENT_TO_PROXY)  # fmt: skip
            self._error(Reply.make(502, "5.5.1", "Error: command not implemented"))

    def _mail(self, command: Command) -> None:
        size = command.param("SIZE")
        limit = self._cfg.message_size_limit
        out = self._out
        refusal = self._client_tls.mail_refusal()
        if refusal is not None:
            out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self._error(refusal)
            return
        if limit and size is not None and size.isdigit() and int(size) > limit:
            out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self._local(Reply.make(552, "5.3.4", "Error: message size exceeds fixed limit"))
            return
        verp = self._verp.request(command)
        if isinstance(verp, Reply):
            out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self._error(verp)
            return
        self._verp.end()
        out.abort_transaction()
        params = tuple(k if v is None else f"{k}={v.decode('ascii', 'replace')}"
                       for k, v in command.params)  # fmt: skip
        out.account.start_transaction(command.address or b"", out.now, params)
        self._policy.new_transaction()
        if verp is None:
            self._forward(command, Slot(Owed.MAIL, command=command), Await.MAIL)
        else:
            self._verp.begin(verp, command)

    def _rcpt(self, command: Command) -> None:
        account = self._out.account
        txn = account.transaction
        if txn is not None and len(txn.rcpt_to) >= self._cfg.max_recipients:
            self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self._local(Reply.make(452, "4.5.3", "Error: too many recipients"))
            return
        refusal = self._verp.rcpt_refusal()
        if refusal is not None:
            self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self._local(refusal)
            return
        account.add_recipient(command.address or b"")
        if not self._policy.rcpt(command):
            self._forward(command, Slot(Owed.RCPT, command=command), Await.RCPT)

    def _quit(self, command: Command) -> None:
        if self._lease.quit(command):
            return
        if self._lease.reachable():
            self._forward(command, Slot(Owed.QUIT, barrier=True, command=command), Await.QUIT)
        else:
            self._out.client_line(command.line, Direction.CLIENT_TO_PROXY)
            self._local(_BYE, close="quit")

    def _sync_violation(self, data_slot: Slot | None) -> None:
        """The client sent more after DATA before the MX's 354 (RFC 2920 §3.1).

        Its reply to DATA becomes 554 5.5.0 and the session ends; the replies owed before
        it (MAIL, RCPT) still go out first, in order. Nothing more is read from the client,
        and the MX never gets a body: DATA is either not sent at all, or its transaction is
        aborted by the close (the MX's late reply to DATA is never waited for).
        """
        self._out.note("client sent data before the MX's 354: SMTP protocol synchronization error")
        self._state.on(On.SYNC_VIOLATION)
        reply = Reply.make(554, "5.5.0", "Error: SMTP protocol synchronization")
        if data_slot is None:
            self._local(reply, close="sync-violation")
            return
        data_slot.kind, data_slot.reply, data_slot.close = Owed.PLAIN, reply, "sync-violation"
        data_slot.direction = Direction.PROXY_TO_CLIENT
        self._delivery.flush()

    def _error(self, reply: Reply) -> None:
        """A local error reply; too many of them end the session."""
        state = self._state
        state.errors += 1
        if state.errors > self._cfg.max_errors:
            self._endings.fail(rp.too_many_errors(self._host), "too-many-errors")
        else:
            self._local(reply)
