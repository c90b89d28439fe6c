"""The milter client and MilterFilter against a tiny scripted milter on loopback (or a unix
socket): every action a milter can answer, protocol options, and each failure (refused,
closed mid-conversation, timeouts, oversized packets, protocol violations)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from mailsluice.filtering.api import (
    Accept,
    AddHeader,
    ChangeHeader,
    ClientInfo,
    EditHeaders,
    Envelope,
    FilterMessage,
    Reject,
    Replace,
)
from mailsluice.milter import messages as m
from mailsluice.milter.client import (
    MilterAddress,
    MilterClosed,
    MilterTimeout,
    MilterUnavailable,
    Timeouts,
    Transaction,
    connect_info,
    converse,
)
from mailsluice.milter.filter import MilterFilter, MilterUnsupported
from mailsluice.milter.protocol import (
    Action,
    MilterError,
    MilterProtocolError,
    PacketDecoder,
    Proto,
    Stage,
    frame,
)
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration

MESSAGE = (
    b"From: Alice <alice@example.org>\r\n"
    b"To: bob@example.net\r\n"
    b"Subject: hello\r\n"
    b"\r\n"
    b"Hi Bob,\r\n"
    b"\r\n"
    b"see you.\r\n"
)
FAST = Timeouts(connect=2.0, command=2.0, message=10.0)


class _Close:
    """Reply sentinel: close the connection now."""


class _Stall:
    """Reply sentinel: stop answering (until the test ends)."""


CLOSE, STALL = _Close(), _Stall()
Reply = m.Message | bytes | _Close | _Stall
Send = Callable[[m.Message], Awaitable[None]]
Handler = Callable[[m.Message, Send], Awaitable[Sequence[Reply]]]

# The NR_* flag that means "no reply" for each command.
_NO_REPLY: dict[type[m.Message], Proto] = {
    m.Connect: Proto.NR_CONN,
    m.Helo: Proto.NR_HELO,
    m.Mail: Proto.NR_MAIL,
    m.Rcpt: Proto.NR_RCPT,
    m.Data: Proto.NR_DATA,
    m.Header: Proto.NR_HDR,
    m.EndOfHeaders: Proto.NR_EOH,
    m.Body: Proto.NR_BODY,
}


class FakeMilter:
    """A scripted milter: answers OPTNEG with ``optneg``, every step with CONTINUE (or
    nothing when it negotiated NR_* for it), end of message with ``eom``; ``on`` maps a
    command type to the replies to give instead (or an async handler). Records every
    command received in ``received``."""

    def __init__(
        self,
        *,
        actions: int = 0x1FF,
        protocol: int = 0,
        version: int = 6,
        macros: tuple[tuple[int, bytes], ...] = (),
        eom: Sequence[Reply] = (m.Accept(),),
        on: dict[type[m.Message], Sequence[Reply] | Handler] | None = None,
        unix_path: Path | None = None,
    ) -> None:
        self.optneg = m.OptNeg(version, actions, protocol, macros)
        self.eom = eom
        self.on = on or {}
        self.unix_path = unix_path
        self.received: list[m.Message] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self.hangups = 0  # connections the client closed

    async def __aenter__(self) -> FakeMilter:
        if self.unix_path is not None:
            self._server = await asyncio.start_unix_server(self._serve, str(self.unix_path))
            self.url = f"unix:{self.unix_path}"
        else:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.url = f"inet:127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Release stalled handlers, let every connection finish (the client has
        hung up by now), then stop listening."""
        assert self._server is not None
        self._stop.set()
        self._server.close()
        async with asyncio.timeout(5):
            await asyncio.gather(*self._handlers)
        await self._server.wait_closed()

    def commands(self, kind: type[m.Message]) -> list[Any]:
        return [c for c in self.received if isinstance(c, kind)]

    async def _replies(self, command: m.Message, send: Send) -> Sequence[Reply]:
        action = self.on.get(type(command))
        if callable(action):
            return await action(command, send)
        if action is not None:
            return action
        if isinstance(command, m.OptNeg):
            return [self.optneg]
        if isinstance(command, m.EndOfMessage):
            return self.eom
        flag = _NO_REPLY.get(type(command))
        if flag is None or self.optneg.protocol & flag:
            return []  # macros, abort, quit, and steps we said we would not answer
        return [m.Continue()]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        decoder = PacketDecoder()

        async def send(reply: m.Message) -> None:
            writer.write(m.encode(reply))
            await writer.drain()

        try:
            while data := await reader.read(1 << 16):
                for code, payload in decoder.feed(data):
                    command = m.decode(code, payload, replies=False)
                    self.received.append(command)
                    for reply in await self._replies(command, send):
                        if isinstance(reply, _Close):
                            return
                        if isinstance(reply, _Stall):
                            with contextlib.suppress(TimeoutError):
                                async with asyncio.timeout(60):
                                    await self._stop.wait()
                            return
                        writer.write(reply if isinstance(reply, bytes) else m.encode(reply))
                    await writer.drain()
            self.hangups += 1
        except ConnectionError:
            pass
        finally:
            self._handlers.discard(task)
            writer.close()


def make_message(raw: bytes = MESSAGE, *, spool: Path | None = None) -> FilterMessage:
    client = ClientInfo(
        session_id="sess-42",
        client_ip="192.0.2.10",
        client_port=40123,
        destination="127.0.0.1:25",
        helo="msa.example.org",
    )
    envelope = Envelope(
        mail_from="alice@example.org",
        rcpt_to=("bob@example.net", "carol@example.net"),
        mail_params=("SIZE=1000",),
    )
    if spool is not None:
        spool.write_bytes(raw)
        return FilterMessage(
            client=client, envelope=envelope, opener=lambda: spool.open("rb"), size=len(raw)
        )
    return FilterMessage(client=client, envelope=envelope, raw=raw)


@contextlib.asynccontextmanager
async def milter(**kwargs: Any) -> AsyncIterator[tuple[FakeMilter, MilterFilter]]:
    async with FakeMilter(**kwargs) as fake:
        yield fake, MilterFilter(MilterAddress.parse(fake.url), timeouts=FAST, hostname="relay")


# --- a whole conversation ---------------------------------------------------------------


async def test_conversation_sends_envelope_headers_body_and_macros() -> None:
    async with milter() as (fake, flt):
        assert await flt.filter(make_message()) == Accept()
    kinds = [type(c).__name__ for c in fake.received if not isinstance(c, m.Macro)]
    assert kinds == [
        "OptNeg", "Connect", "Helo", "Mail", "Rcpt", "Rcpt", "Data", "Header", "Header",
        "Header", "EndOfHeaders", "Body", "EndOfMessage", "Quit",
    ]  # fmt: skip
    assert fake.commands(m.Connect) == [m.Connect(b"[192.0.2.10]", b"4", 40123, b"192.0.2.10")]
    assert fake.commands(m.Helo) == [m.Helo(b"msa.example.org")]
    assert fake.commands(m.Mail) == [m.Mail((b"<alice@example.org>", b"SIZE=1000"))]
    assert fake.commands(m.Rcpt) == [
        m.Rcpt((b"<bob@example.net>",)),
        m.Rcpt((b"<carol@example.net>",)),
    ]
    assert fake.commands(m.Header)[0] == m.Header(b"From", b"Alice <alice@example.org>")
    assert fake.commands(m.Body) == [m.Body(b"Hi Bob,\r\n\r\nsee you.\r\n")]
    macros = {c.for_code: dict(c.pairs) for c in fake.commands(m.Macro)}
    assert macros[b"C"][b"j"] == b"relay"
    assert macros[b"C"][b"{client_addr}"] == b"192.0.2.10"
    assert macros[b"M"][b"{mail_addr}"] == b"alice@example.org"
    assert macros[b"E"][b"i"] == macros[b"M"][b"i"] == b"sess42T1"
    offer = fake.commands(m.OptNeg)[0]
    assert offer.version == 6
    assert offer.actions == sum(Action)


async def test_milter_macro_lists_choose_what_is_sent() -> None:
    wanted = ((Stage.CONNECT, b"{client_addr} j"), (Stage.EOM, b""))
    async with milter(macros=wanted) as (fake, flt):
        await flt.filter(make_message())
    macros = {c.for_code: dict(c.pairs) for c in fake.commands(m.Macro)}
    assert macros[b"C"] == {b"{client_addr}": b"192.0.2.10", b"j": b"relay"}
    assert b"E" not in macros  # asked for none at end of message
    assert b"i" in macros[b"M"]  # no list for MAIL: everything we have


async def test_header_values_follow_the_leading_space_option() -> None:
    raw = b"Subject:  two\r\n\tfolded\r\nX-Tight:v\r\n\r\nbody\r\n"
    async with milter() as (fake, flt):
        await flt.filter(make_message(raw))
    assert fake.commands(m.Header) == [
        m.Header(b"Subject", b" two\n\tfolded"),
        m.Header(b"X-Tight", b"v"),
    ]
    async with milter(protocol=Proto.HDR_LEADSPC) as (fake, flt):
        await flt.filter(make_message(raw))
    assert fake.commands(m.Header) == [
        m.Header(b"Subject", b"  two\n\tfolded"),
        m.Header(b"X-Tight", b"v"),
    ]


async def test_body_is_sent_in_chunks_of_at_most_65535_bytes(tmp_path: Path) -> None:
    body = b"".join(b"line %06d of a long body\r\n" % i for i in range(8000))
    raw = b"Subject: big\r\n\r\n" + body
    async with milter() as (fake, flt):
        assert await flt.filter(make_message(raw, spool=tmp_path / "spool")) == Accept()
    chunks = [c.chunk for c in fake.commands(m.Body)]
    assert len(chunks) == 4
    assert all(0 < len(c) <= 65535 for c in chunks)
    assert b"".join(chunks) == body


async def test_steps_the_milter_declines_are_not_sent() -> None:
    skip = Proto.NOCONNECT | Proto.NOHELO | Proto.NOHDRS | Proto.NOBODY | Proto.NODATA
    async with milter(protocol=skip) as (fake, flt):
        assert await flt.filter(make_message()) == Accept()
    sent = {type(c) for c in fake.received}
    assert not sent & {m.Connect, m.Helo, m.Header, m.Body, m.Data}
    assert {m.Mail, m.Rcpt, m.EndOfHeaders, m.EndOfMessage} <= sent


async def test_version_2_milters_get_no_data_command() -> None:
    async with milter(version=2) as (fake, flt):
        assert await flt.filter(make_message()) == Accept()
    assert not fake.commands(m.Data)
    assert all(c.for_code != b"T" for c in fake.commands(m.Macro))
    assert fake.commands(m.EndOfMessage)


async def test_a_header_too_long_for_the_milter_is_refused() -> None:
    folded = b"\r\n\t".join([b"x" * 70] * 1000)  # one field of ~72 KB
    async with milter() as (fake, flt):
        with pytest.raises(MilterError, match="over the milter data limit"):
            await flt.filter(make_message(b"X-Huge: " + folded + b"\r\n\r\nbody\r\n"))
    assert not fake.commands(m.Header)


async def test_steps_without_replies_do_not_wait() -> None:
    no_replies = sum(_NO_REPLY.values())
    async with milter(protocol=no_replies) as (fake, flt):
        assert await flt.filter(make_message()) == Accept()
    assert len(fake.commands(m.Header)) == 3


async def test_skip_stops_the_body() -> None:
    body = b"x" * 65535 * 3
    async with milter(protocol=Proto.SKIP, on={m.Body: [m.Skip()]}) as (fake, flt):
        assert await flt.filter(make_message(b"Subject: s\r\n\r\n" + body)) == Accept()
    assert len(fake.commands(m.Body)) == 1
    assert fake.commands(m.EndOfMessage)


async def test_unix_socket(tmp_path: Path) -> None:
    async with milter(unix_path=tmp_path / "milter.sock") as (fake, flt):
        assert fake.url.startswith("unix:")
        assert await flt.filter(make_message()) == Accept()


# --- decisions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("eom", "verdict"),
    [
        ([m.Accept()], Accept()),
        ([m.Continue()], Accept()),
        ([m.Reject()], Reject(550, "5.7.1 Message rejected by filter")),
        ([m.Tempfail()], Reject(451, "4.7.1 Message deferred by filter, try again later")),
        ([m.Discard()], Reject(550, "5.7.1 Message discarded by filter")),
        ([m.ReplyCode(b"554 5.7.1 Spam detected")], Reject(554, "5.7.1 Spam detected")),
        ([m.ReplyCode(b"451 4.7.1 Greylisted, %%retry")], Reject(451, "4.7.1 Greylisted, %retry")),
        ([m.Progress(), m.Progress(), m.Accept()], Accept()),
        ([m.Shutdown()], Reject(451, "4.7.1 Filter unavailable, try again later")),
    ],
    ids=[
        "accept",
        "continue",
        "reject",
        "tempfail",
        "discard",
        "replycode",
        "replycode4xx",
        "progress",
        "shutdown",
    ],
)
async def test_end_of_message_decisions(eom: list[Reply], verdict: object) -> None:
    async with milter(eom=eom) as (_fake, flt):
        assert await flt.filter(make_message()) == verdict


async def test_early_accept_ends_the_conversation() -> None:
    async with milter(on={m.Connect: [m.Accept()]}) as (fake, flt):
        assert await flt.filter(make_message()) == Accept()
    assert not fake.commands(m.Mail)
    assert [type(c) for c in fake.received[-2:]] == [m.Abort, m.Quit]


async def test_early_reject_at_header() -> None:
    async with milter(on={m.Header: [m.ReplyCode(b"550 5.7.0 bad header")]}) as (fake, flt):
        assert await flt.filter(make_message()) == Reject(550, "5.7.0 bad header")
    assert len(fake.commands(m.Header)) == 1
    assert not fake.commands(m.Body)


async def test_a_refused_recipient_refuses_the_message() -> None:
    async with milter(on={m.Rcpt: [m.ReplyCode(b"550 5.1.1 no such user")]}) as (fake, flt):
        assert await flt.filter(make_message()) == Reject(550, "5.1.1 no such user")
    assert len(fake.commands(m.Rcpt)) == 1


async def test_quarantine_is_accepted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "mailsluice.milter")
    async with milter(eom=[m.Quarantine(b"looks odd"), m.Accept()]) as (_fake, flt):
        assert await flt.filter(make_message()) == Accept()
    assert "quarantine" in caplog.text
    assert "looks odd" in caplog.text


# --- modifications ----------------------------------------------------------------------


async def test_header_modifications_become_edit_headers() -> None:
    eom: list[Reply] = [
        m.AddHeader(b"X-Scanned", b"yes"),
        m.InsertHeader(0, b"X-First", b"on top\n\tfolded"),
        m.ChangeHeader(1, b"Subject", b"changed"),
        m.ChangeHeader(1, b"To", b""),
        m.ChangeHeader(1, b"X-Spam", b"Yes"),  # not in the message: appended, like Postfix
        m.ChangeHeader(2, b"X-Missing", b""),  # deleting what is not there: nothing
        m.Continue(),
    ]
    async with milter(eom=eom) as (_fake, flt):
        verdict = await flt.filter(make_message())
    assert verdict == EditHeaders(
        add=(
            AddHeader("X-Scanned", "yes"),
            AddHeader("X-First", "on top\r\n\tfolded", index=0),
            AddHeader("X-Spam", "Yes"),
        ),
        change=(
            ChangeHeader("Subject", "changed", 1),
            ChangeHeader("To", None, 1),
            ChangeHeader("X-Missing", None, 2),
        ),
    )


async def test_leading_space_values_keep_their_exact_spacing() -> None:
    eom: list[Reply] = [m.InsertHeader(0, b"DKIM-Signature", b" v=1;\n\tb=abc"), m.Accept()]
    async with milter(protocol=Proto.HDR_LEADSPC, eom=eom) as (_fake, flt):
        verdict = await flt.filter(make_message())
    assert verdict == EditHeaders(add=(AddHeader("DKIM-Signature", " v=1;\r\n\tb=abc", 0),))


async def test_body_replacement_keeps_the_edited_header() -> None:
    eom: list[Reply] = [
        m.AddHeader(b"X-Rewritten", b"1"),
        m.ReplaceBody(b"new body, "),
        m.ReplaceBody(b"in two chunks\r\n"),
        m.Accept(),
    ]
    async with milter(eom=eom) as (_fake, flt):
        verdict = await flt.filter(make_message())
    assert verdict == Replace(
        b"From: Alice <alice@example.org>\r\nTo: bob@example.net\r\nSubject: hello\r\n"
        b"X-Rewritten: 1\r\n\r\nnew body, in two chunks\r\n"
    )


@pytest.mark.parametrize(
    "edit",
    [m.AddRcpt(b"<x@example.com>"), m.DelRcpt(b"<bob@example.net>"), m.ChangeFrom((b"<a@b>",))],
)
async def test_envelope_changes_are_refused_clearly(edit: m.Message) -> None:
    async with milter(eom=[edit, m.Accept()]) as (_fake, flt):
        with pytest.raises(MilterUnsupported, match="change the envelope"):
            await flt.filter(make_message())


async def test_modifications_are_ignored_when_the_message_is_refused() -> None:
    async with milter(eom=[m.AddRcpt(b"<x@example.com>"), m.Reject()]) as (_fake, flt):
        assert await flt.filter(make_message()) == Reject(550, "5.7.1 Message rejected by filter")


async def test_header_injection_in_a_value_is_a_protocol_error() -> None:
    async with milter(eom=[m.AddHeader(b"X-Evil", b"a\nBcc: victim@example.com"), m.Accept()]) as (
        _fake,
        flt,
    ):
        with pytest.raises(MilterProtocolError, match="bare line break"):
            await flt.filter(make_message())


# --- protocol violations ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"actions": int(Action.ADDHDRS), "eom": [m.ChangeHeader(1, b"A", b"b"), m.Accept()]},
            "without negotiating",
        ),
        ({"on": {m.Connect: [m.AddHeader(b"A", b"b")]}}, "unexpected reply"),
        ({"eom": [m.Skip()]}, "unexpected reply"),
        ({"version": 7}, "protocol version 7"),
        ({"on": {m.OptNeg: [m.Continue()]}}, "expected OPTNEG"),
        ({"eom": [frame(b"Z")]}, "unknown milter reply code"),
        ({"eom": [m.ReplyCode(b"250 fine")]}, "malformed reply code"),
        ({"eom": [m.AddHeader(b"Bad Name", b"v"), m.Accept()]}, "invalid header name"),
        ({"eom": [m.AddHeader(b"X", b"\xff\xfe"), m.Accept()]}, "not UTF-8"),
    ],
    ids=[
        "not-negotiated",
        "edit-too-early",
        "skip-at-eom",
        "version",
        "no-optneg",
        "unknown-code",
        "bad-replycode",
        "bad-name",
        "not-utf8",
    ],
)
async def test_protocol_violations(kwargs: dict[str, Any], match: str) -> None:
    async with milter(**kwargs) as (_fake, flt):
        with pytest.raises(MilterProtocolError, match=match):
            await flt.filter(make_message())


async def test_oversized_packet_is_refused_before_it_is_read() -> None:
    huge = struct.pack(">I", 2**31) + b"h"
    async with milter(on={m.OptNeg: [huge]}) as (_fake, flt):
        with pytest.raises(MilterProtocolError, match="over the 1048576-byte limit"):
            await flt.filter(make_message())


async def test_packet_size_cap_is_configurable() -> None:
    async with FakeMilter(eom=[m.AddHeader(b"X-Long", b"v" * 200), m.Accept()]) as fake:
        flt = MilterFilter(MilterAddress.parse(fake.url), timeouts=FAST, max_packet=100)
        with pytest.raises(MilterProtocolError, match="over the 100-byte limit"):
            await flt.filter(make_message())


async def test_replacement_body_size_is_capped() -> None:
    eom: list[Reply] = [m.ReplaceBody(b"x" * 60_000), m.ReplaceBody(b"x" * 60_000), m.Accept()]
    async with FakeMilter(eom=eom) as fake:
        flt = MilterFilter(MilterAddress.parse(fake.url), timeouts=FAST, max_body=100_000)
        with pytest.raises(MilterProtocolError, match="100000-byte limit"):
            await flt.filter(make_message())


# --- failures ---------------------------------------------------------------------------


async def test_connection_refused() -> None:
    port = free_port()  # nothing listens there now
    flt = MilterFilter.from_url(f"inet:127.0.0.1:{port}", timeout=2)
    with pytest.raises(MilterUnavailable, match=f"127.0.0.1:{port}.*is it running"):
        await flt.filter(make_message())


async def test_missing_unix_socket(tmp_path: Path) -> None:
    flt = MilterFilter.from_url(f"unix:{tmp_path / 'nothing.sock'}", timeout=2)
    with pytest.raises(MilterUnavailable, match="cannot connect"):
        await flt.filter(make_message())


async def test_milter_closes_mid_conversation() -> None:
    async with milter(on={m.Header: [CLOSE]}) as (_fake, flt):
        with pytest.raises(MilterClosed, match="at header: milter closed the connection"):
            await flt.filter(make_message())


async def test_milter_closes_mid_packet() -> None:
    async with milter(eom=[b"\0\0\0\x10hab", CLOSE]) as (_fake, flt):
        with pytest.raises(MilterClosed, match="7 bytes of a packet"):
            await flt.filter(make_message())


async def test_silent_milter_times_out() -> None:
    async with FakeMilter(on={m.OptNeg: [STALL]}) as fake:
        flt = MilterFilter.from_url(fake.url, timeout=0.3)
        with pytest.raises(MilterTimeout, match=r"at optneg: no reply within 0\.3s"):
            await flt.filter(make_message())


def trickle(sent: list[int], *, count: int, interval: float, final: m.Message) -> Handler:
    """An end-of-message handler: PROGRESS ``count`` times, ``interval`` s apart, then
    ``final``; counts what it sent in ``sent``."""

    async def handler(_command: m.Message, send: Send) -> Sequence[Reply]:
        for _ in range(count):
            await asyncio.sleep(interval)
            await send(m.Progress())
            sent.append(1)
        await asyncio.sleep(interval)
        return [final]

    return handler


async def test_progress_extends_the_wait_for_a_reply() -> None:
    sent: list[int] = []
    handler = trickle(sent, count=5, interval=0.15, final=m.Accept())  # 0.9 s in all
    async with FakeMilter(on={m.EndOfMessage: handler}) as fake:
        flt = MilterFilter.from_url(fake.url, timeout=0.4, message_timeout=10)
        assert await flt.filter(make_message()) == Accept()
    assert len(sent) == 5


async def test_without_progress_the_same_delay_times_out() -> None:
    handler = trickle([], count=0, interval=0.9, final=m.Accept())
    async with FakeMilter(on={m.EndOfMessage: handler}) as fake:
        flt = MilterFilter.from_url(fake.url, timeout=0.4, message_timeout=10)
        with pytest.raises(MilterTimeout, match=r"at eom: no reply within 0\.4s"):
            await flt.filter(make_message())


async def test_progress_cannot_extend_past_the_message_deadline() -> None:
    sent: list[int] = []
    handler = trickle(sent, count=100, interval=0.05, final=m.Accept())  # 5 s
    async with FakeMilter(on={m.EndOfMessage: handler}) as fake:
        flt = MilterFilter.from_url(fake.url, timeout=0.4, message_timeout=0.6)
        with pytest.raises(MilterTimeout, match=r"longer than 0\.6s"):
            await flt.filter(make_message())
    assert 0 < len(sent) < 100


async def test_a_milter_that_stops_reading_times_out() -> None:
    def body() -> Iterator[bytes]:
        for _ in range(1000):  # up to 64 MB, far more than the socket buffers hold
            yield b"x" * 65535

    async with FakeMilter(protocol=Proto.NR_BODY, on={m.Body: [STALL]}) as fake:
        txn = Transaction(
            connect=connect_info("192.0.2.1", 1),
            helo=None,
            mail=(b"<>",),
            rcpts=((b"<a@b>",),),
            headers=(),
            body=body(),
        )
        timeouts = Timeouts(connect=2, command=0.5, message=30)
        with pytest.raises(MilterTimeout, match=r"did not read our data within 0\.5s"):
            await converse(MilterAddress.parse(fake.url), txn, timeouts=timeouts)


async def test_cancelling_the_filter_hangs_up_on_the_milter() -> None:
    async with milter(eom=[]) as (fake, flt):  # the milter never answers end of message
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):  # e.g. the chain's filter timeout
                await flt.filter(make_message())
    assert fake.hangups == 1  # __aexit__ waited for the milter side to see EOF


def test_addresses_parse_and_print() -> None:
    assert str(MilterAddress.parse("inet:127.0.0.1:11332")) == "inet:127.0.0.1:11332"
    assert MilterAddress.parse("inet:8891@localhost") == MilterAddress("inet", "localhost", 8891)
    assert str(MilterAddress.parse("inet6:[::1]:8891")) == "inet:[::1]:8891"
    assert MilterAddress.parse("unix:/run/milter.sock") == MilterAddress(
        "unix", path="/run/milter.sock"
    )
    assert MilterAddress.parse("local:/x") == MilterAddress("unix", path="/x")
    for bad in ("127.0.0.1:11332", "inet:host", "inet:host:0", "tcp:host:1", "unix:"):
        with pytest.raises(ValueError, match="milter address"):
            MilterAddress.parse(bad)


def test_all_failures_are_milter_errors() -> None:
    for cls in (MilterUnavailable, MilterTimeout, MilterClosed, MilterUnsupported):
        assert issubclass(cls, MilterError)
