"""One connection of ``ScriptedMX``: a small SMTP server state machine with fault hooks.

Commands end at LF (the raw line, CR included, is recorded so tests can spot a bare LF).
DATA ends at ``CRLF.CRLF`` -- plus, in lenient mode, at each configured sloppy sequence (see
:mod:`.mx_body`).  See :mod:`.faults` for what each fault does at each phase.  A tarpit
(``reply_delay``) waits before every reply it sends.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import Counter

from mailsluice_lab.peers.faults import Action, Fault, Outcome, Phase
from mailsluice_lab.peers.mx_body import collect_body, finish_message
from mailsluice_lab.peers.mx_state import MxServices, SessionRecord
from mailsluice_lab.peers.stream import LineTooLong


def _address(arg: bytes, keyword: bytes) -> str | None:
    if not arg.upper().startswith(keyword):
        return None
    rest = arg[len(keyword) :].strip()
    if rest.startswith(b"<"):
        end = rest.find(b">")
        return None if end < 0 else rest[1:end].decode("utf-8", "surrogateescape")
    return rest.split(b" ", 1)[0].decode("utf-8", "surrogateescape")


class ScriptedSession:
    """Runs one connection; never raises except ``CancelledError``."""

    def __init__(self, mx: MxServices, record: SessionRecord) -> None:
        self.mx = mx
        self.cfg = mx.config
        self.rec = record
        self.conn = record.conn
        self._counts: Counter[Phase] = Counter()
        self.helo: bytes | None = None
        self.mail_from: str | None = None
        self.rcpts: list[str] = []
        self.greeting_refused = False

    # -- faults and replies --------------------------------------------------------------
    def take_fault(self, phase: Phase) -> Fault | None:
        self._counts[phase] += 1
        for fault in self.cfg.faults:
            if fault.matches(phase, self._counts[phase], self.rec.number):
                self.rec.fired.append(fault)
                return fault
        return None

    async def send(self, data: bytes, *, paced: bool = True) -> None:
        """Write a reply (after the tarpit's delay, unless ``paced`` is off)."""
        if paced and self.cfg.reply_delay > 0:
            await asyncio.sleep(self.cfg.reply_delay)
        chunk = self.cfg.reply_chunk
        if not chunk:
            await self.conn.send(data, timeout=self.cfg.idle_timeout)
            return
        for i in range(0, len(data), chunk):
            await self.conn.send(data[i : i + chunk], timeout=self.cfg.idle_timeout)
            await asyncio.sleep(self.cfg.chunk_delay)

    async def stall(self) -> Outcome:
        """Never answer; keep reading (recorded) until the peer leaves or teardown."""
        while await self.conn.read_some(timeout=None):
            pass
        return Outcome.END

    async def apply(self, fault: Fault, normal: bytes | None) -> Outcome:
        action = fault.action
        if action is Action.CLOSE:
            self.conn.close()
            return Outcome.END
        if action is Action.RESET:
            self.conn.reset()
            return Outcome.END
        if action is Action.STALL:
            return await self.stall()
        if action is Action.HALF_CLOSE:
            if normal:
                await self.send(normal)
            if fault.pause > 0:
                await asyncio.sleep(fault.pause)
            self.conn.half_close()
            return await self.stall()
        await self.send(fault.payload(normal))
        if action is Action.REPLY_421:
            self.conn.close()
            return Outcome.END
        return Outcome.OK if fault.accepted else Outcome.REFUSED

    async def respond(self, phase: Phase, normal: bytes | None) -> Outcome:
        fault = self.take_fault(phase)
        if fault is None:
            if normal:
                await self.send(normal)
            return Outcome.OK
        return await self.apply(fault, normal)

    # -- the session ---------------------------------------------------------------------
    async def run(self) -> None:
        if await self.respond(Phase.CONNECT, None) is Outcome.END:
            return
        greeting = f"220 {self.cfg.hostname} ESMTP ScriptedMX\r\n".encode()
        outcome = await self.respond(Phase.GREETING, self.cfg.greeting or greeting)
        if outcome is Outcome.END:
            return
        self.greeting_refused = outcome is Outcome.REFUSED
        while True:
            line = await self.read_command()
            if line is None:
                return
            if await self.dispatch(line) is Outcome.END:
                return

    async def read_command(self) -> bytes | None:
        try:
            line = await self.conn.read_line(
                limit=self.cfg.max_command, timeout=self.cfg.idle_timeout
            )
        except TimeoutError:
            self.rec.error = "idle timeout"
            await self.send(b"421 4.4.2 mx.test Error: timeout exceeded\r\n")
            return None
        except LineTooLong as exc:
            self.rec.commands.append(exc.partial)
            while True:  # skip to the end of the overlong line
                try:
                    rest = await self.conn.read_line(
                        limit=self.cfg.max_command, timeout=self.cfg.idle_timeout
                    )
                except LineTooLong:
                    continue
                if not rest.endswith(b"\n"):
                    return None
                break
            await self.send(b"500 5.5.2 Error: command too long\r\n")
            return b""
        if not line.endswith(b"\n"):
            if line:
                self.rec.commands.append(line)
            return None
        self.rec.commands.append(line)
        return line

    async def dispatch(self, line: bytes) -> Outcome:
        stripped = line.rstrip(b"\r\n")
        if not stripped:
            await self.send(b"500 5.5.2 Error: bad syntax\r\n")
            return Outcome.REFUSED
        verb, _, arg = stripped.partition(b" ")
        verb = verb.upper()
        if verb == b"QUIT":
            await self.respond(Phase.QUIT, b"221 2.0.0 Bye\r\n")
            self.conn.close()
            return Outcome.END
        if self.greeting_refused:
            await self.send(b"503 5.5.1 Error: greeting was refused, send QUIT\r\n")
            return Outcome.REFUSED
        handler = {
            b"EHLO": self.on_ehlo,
            b"HELO": self.on_ehlo,
            b"STARTTLS": self.on_starttls,
            b"MAIL": self.on_mail,
            b"RCPT": self.on_rcpt,
            b"DATA": self.on_data,
        }.get(verb)
        if handler is not None:
            return await handler(verb, arg)
        if verb == b"RSET":
            self.reset_transaction()
            await self.send(b"250 2.0.0 Ok\r\n")
            return Outcome.OK
        if verb == b"NOOP":
            await self.send(b"250 2.0.0 Ok\r\n")
            return Outcome.OK
        await self.send(b"502 5.5.2 Error: command not recognized\r\n")
        return Outcome.REFUSED

    def reset_transaction(self) -> None:
        self.mail_from = None
        self.rcpts = []

    def ehlo_reply(self) -> bytes:
        caps = self.cfg.capabilities_for(tls_active=self.conn.tls)
        lines = [self.cfg.hostname, *caps]
        out = [f"250-{text}" for text in lines[:-1]] + [f"250 {lines[-1]}"]
        return ("\r\n".join(out) + "\r\n").encode()

    async def on_ehlo(self, verb: bytes, arg: bytes) -> Outcome:
        phase = Phase.EHLO2 if self.conn.tls else Phase.EHLO
        normal = self.ehlo_reply() if verb == b"EHLO" else f"250 {self.cfg.hostname}\r\n".encode()
        outcome = await self.respond(phase, normal)
        if outcome is Outcome.OK:
            self.helo = arg
            self.reset_transaction()
        return outcome

    async def on_starttls(self, verb: bytes, arg: bytes) -> Outcome:
        context = self.cfg.tls
        if self.conn.tls:
            await self.send(b"503 5.5.1 Error: TLS already active\r\n")
            return Outcome.REFUSED
        # Whatever is buffered now was pipelined after STARTTLS: record it and discard it.
        self.rec.starttls_leftover = self.conn.take_buffered()
        fault = self.take_fault(Phase.STARTTLS)
        if fault is None and context is not None:
            if self.cfg.reply_delay > 0:
                await asyncio.sleep(self.cfg.reply_delay)
            # Write the 220 and start TLS in the same step: the ClientHello cannot reach
            # the plaintext buffer.
            self.conn.write(b"220 2.0.0 Ready to start TLS\r\n" + self.cfg.starttls_injection)
            return await self.handshake(context)
        if fault is None:
            await self.send(b"454 4.7.0 TLS not available due to local problem\r\n")
            return Outcome.REFUSED
        outcome = await self.apply(fault, b"220 2.0.0 Ready to start TLS\r\n")
        if outcome is not Outcome.OK or context is None:
            return outcome
        return await self.handshake(context)

    async def handshake(self, context: ssl.SSLContext) -> Outcome:
        fault = self.take_fault(Phase.HANDSHAKE)
        if fault is not None and fault.action is not Action.EXTRA:
            if fault.action is Action.STALL:
                return await self.stall()
            hello = await self.conn.read_some(timeout=self.cfg.idle_timeout)
            if not hello:
                return Outcome.END
            outcome = await self.apply(fault, None)
            if outcome is not Outcome.END:
                # The client's TLS layer cannot continue after plaintext; wait for it to leave.
                await self.conn.read_until_eof(timeout=self.cfg.idle_timeout)
            return Outcome.END
        try:
            await self.conn.start_tls(context, server_side=True, timeout=self.cfg.handshake_timeout)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            self.rec.tls_error = repr(exc)
            return Outcome.END
        self.rec.tls = True
        self.rec.tls_version = self.conn.tls_version()
        self.helo = None
        self.reset_transaction()
        if fault is not None:
            await self.send(fault.payload(None))
        return Outcome.OK

    async def on_mail(self, verb: bytes, arg: bytes) -> Outcome:
        address = _address(arg, b"FROM:")
        if self.helo is None:
            await self.send(b"503 5.5.1 Error: send HELO/EHLO first\r\n")
            return Outcome.REFUSED
        if self.mail_from is not None:
            await self.send(b"503 5.5.1 Error: nested MAIL command\r\n")
            return Outcome.REFUSED
        if address is None:
            await self.send(b"501 5.5.4 Syntax: MAIL FROM:<address>\r\n")
            return Outcome.REFUSED
        outcome = await self.respond(Phase.MAIL, b"250 2.1.0 Ok\r\n")
        if outcome is Outcome.OK:
            self.mail_from = address
            self.rcpts = []
        return outcome

    async def on_rcpt(self, verb: bytes, arg: bytes) -> Outcome:
        address = _address(arg, b"TO:")
        if self.mail_from is None:
            await self.send(b"503 5.5.1 Error: need MAIL command\r\n")
            return Outcome.REFUSED
        if address is None:
            await self.send(b"501 5.5.4 Syntax: RCPT TO:<address>\r\n")
            return Outcome.REFUSED
        if self.cfg.reject_rcpt is not None and self.cfg.reject_rcpt.search(address):
            await self.send(f"550 5.1.1 <{address}>: Recipient address rejected\r\n".encode())
            return Outcome.REFUSED
        if self.cfg.defer_rcpt is not None and self.cfg.defer_rcpt.search(address):
            await self.send(f"451 4.3.0 <{address}>: Recipient address deferred\r\n".encode())
            return Outcome.REFUSED
        outcome = await self.respond(Phase.RCPT, b"250 2.1.5 Ok\r\n")
        if outcome is Outcome.OK:
            self.rcpts.append(address)
        return outcome

    async def on_data(self, verb: bytes, arg: bytes) -> Outcome:
        if self.mail_from is None:
            await self.send(b"503 5.5.1 Error: need MAIL command\r\n")
            return Outcome.REFUSED
        if not self.rcpts:
            await self.send(b"554 5.5.1 Error: no valid recipients\r\n")
            return Outcome.REFUSED
        outcome = await self.respond(Phase.DATA, b"354 End data with <CR><LF>.<CR><LF>\r\n")
        if outcome is not Outcome.OK:
            return outcome
        body = await collect_body(self)
        if body is None:
            return Outcome.END
        return await finish_message(self, body)
