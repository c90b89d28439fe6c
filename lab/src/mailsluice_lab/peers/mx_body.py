"""DATA handling of ``ScriptedMX``: find end-of-data, apply BODY and DOT faults, store.

A strict receiver ends DATA only at ``CRLF.CRLF`` (a dot right after the 354 also ends it,
because the DATA command's own CRLF precedes it).  In lenient mode the receiver also ends DATA
at each configured sloppy sequence, as a vulnerable MTA would (reliability.md §2.2); the bytes
after it are read as new commands, so a smuggled transaction becomes a second ledger entry.

The pace of the answer to end-of-data: a tarpit waits ``reply_delay + data_reply_delay``
before it stores the message; then ``stored_reply_delay`` passes between storing and
answering (the MX has the message, the client does not know yet).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Protocol

from mailsluice_lab.peers.faults import Action, Fault, Outcome, Phase
from mailsluice_lab.peers.mx_state import MxConfig, MxServices, SessionRecord
from mailsluice_lab.peers.stream import BufferedConnection


class BodySession(Protocol):
    """What the DATA phase needs from its session (``ScriptedSession``)."""

    mx: MxServices
    cfg: MxConfig
    rec: SessionRecord
    conn: BufferedConnection
    helo: bytes | None
    mail_from: str | None
    rcpts: list[str]

    def take_fault(self, phase: Phase) -> Fault | None: ...

    async def send(self, data: bytes, *, paced: bool = True) -> None: ...

    async def apply(self, fault: Fault, normal: bytes | None) -> Outcome: ...

    def reset_transaction(self) -> None: ...


_LENIENT_UNSTUFF = re.compile(rb"(\r\n|\r|\n)\.")


@dataclass(frozen=True)
class Body:
    wire: bytes  # dot-stuffed, as received, end-of-data sequence excluded
    content: bytes  # un-dot-stuffed (lines keep their endings)
    overflow: bool  # larger than the MX's max_message: not kept


def _earliest(buf: bytearray, ends: tuple[bytes, ...], start: int) -> tuple[int, bytes] | None:
    best: tuple[int, bytes] | None = None
    for end in ends:
        idx = buf.find(end, start)
        if idx < 0:
            continue
        if best is None or idx < best[0] or (idx == best[0] and len(end) > len(best[1])):
            best = (idx, end)
    return best


def unstuff(wire: bytes, *, lenient: bool) -> bytes:
    """Remove one leading dot from each line (lines end at CRLF; lenient: also bare CR/LF)."""
    content = wire[1:] if wire.startswith(b".") else wire
    if lenient:
        return _LENIENT_UNSTUFF.sub(rb"\1", content)
    return content.replace(b"\r\n.", b"\r\n")


async def _body_fault(s: BodySession, fault: Fault) -> Outcome:
    if fault.action is Action.STALL:
        s.conn.pause_reading()  # stop reading: the sender's TCP window fills up
        await s.conn.wait_closed(timeout=None)
        return Outcome.END
    if fault.action in (Action.CLOSE, Action.RESET, Action.REPLY_421, Action.HALF_CLOSE):
        return await s.apply(fault, None)
    await s.send(fault.payload(None))  # unsolicited, mid-body; keep reading
    return Outcome.OK


async def collect_body(s: BodySession) -> Body | None:
    """Read DATA up to its end; ``None`` if the session ended first (EOF, timeout, fault)."""
    ends = s.cfg.end_sequences
    longest = max(len(e) for e in ends)
    buf = bytearray(b"\r\n")
    prefix = 2  # the DATA command's CRLF, so ".\r\n" right after 354 ends the data
    fault = s.take_fault(Phase.BODY)
    received = 0
    overflow = False
    search_from = 0
    while (hit := _earliest(buf, ends, search_from)) is None:
        search_from = max(0, len(buf) - longest + 1)
        try:
            chunk = await s.conn.read_some(timeout=s.cfg.idle_timeout)
        except TimeoutError:
            s.rec.error = "idle timeout in DATA"
            await s.send(b"421 4.4.2 mx.test Error: timeout exceeded\r\n")
            return None
        if not chunk:
            s.rec.bodies.append(bytes(buf[prefix:]))
            s.rec.error = "EOF in DATA"
            s.rec.ended_in_data = True
            return None
        buf += chunk
        received += len(chunk)
        if fault is not None and received >= fault.after_bytes:
            fired, fault = fault, None
            if await _body_fault(s, fired) is Outcome.END:
                s.rec.bodies.append(bytes(buf[prefix:]))
                return None
        if len(buf) > s.cfg.max_message + prefix + longest:
            overflow = True  # too big to keep: drop what was searched already
            del buf[:search_from]
            prefix = 0
            search_from = 0
    idx, end = hit
    first_eol = end[: len(end) - len(end.lstrip(b"\r\n"))]
    wire = bytes(buf[prefix : max(prefix, idx + len(first_eol))])
    s.conn.unread(bytes(buf[idx + len(end) :]))
    s.rec.bodies.append(wire)
    if overflow:
        return Body(wire=b"", content=b"", overflow=True)
    return Body(wire=wire, content=unstuff(wire, lenient=bool(s.cfg.lenient)), overflow=False)


async def _pace_end_of_data(s: BodySession) -> None:
    """A tarpit's wait before it takes the message (its 250 is not delayed again)."""
    delay = s.cfg.reply_delay + s.cfg.data_reply_delay
    if delay > 0:
        await asyncio.sleep(delay)


async def _wait_stored(s: BodySession) -> None:
    """Stored, not yet answered: ``stored_reply_delay``."""
    low, high = s.cfg.stored_reply_delay
    if high > 0:
        await asyncio.sleep(s.mx.rng.uniform(low, high))


async def finish_message(s: BodySession, body: Body) -> Outcome:
    """Answer end-of-data (DOT phase) and store the message if the MX accepts it."""
    mail_from, rcpts = s.mail_from or "", list(s.rcpts)
    s.reset_transaction()
    if body.overflow:
        await s.send(b"552 5.3.4 Error: message file too big\r\n")
        return Outcome.REFUSED
    normal = f"250 2.0.0 Ok: queued as {s.mx.next_qid()}\r\n".encode()
    fault = s.take_fault(Phase.DOT)
    if fault is None:
        await _pace_end_of_data(s)  # (a fault's reply is paced as any other)
        store, answer = True, normal
    elif fault.action in (Action.CLOSE, Action.RESET, Action.STALL):
        store, answer = fault.store, b""
    elif fault.action is Action.HALF_CLOSE:  # the 250 goes out before the half-close
        store, answer = True, normal
    elif fault.action is Action.EXTRA:
        store, answer = fault.store or fault.accepted, normal
    else:
        payload = fault.payload(normal)
        store = fault.store or (fault.action is Action.RAW and fault.accepted)
        answer = payload
    if store:
        s.mx.store(
            mail_from=mail_from,
            rcpt_tos=rcpts,
            data=body.content,
            reply=answer.decode("utf-8", "replace").rstrip("\r\n"),
            record=s.rec,
            tls=s.conn.tls,
            wire=body.wire,
            helo=None if s.helo is None else s.helo.decode("utf-8", "replace"),
        )
        await _wait_stored(s)
    if fault is None:
        await s.send(normal, paced=False)
        return Outcome.OK
    return await s.apply(fault, normal)
