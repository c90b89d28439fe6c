"""Stateful property test of the Relay: random interleavings of a client and an MX.

The client model numbers what it is owed (one reply per line it sends, one per message
it ends, the greeting first) and reads replies in order, as a pipelining MSA does. The
MX model is a strict receiver that answers the oldest command it received. Invariants:

* the client gets a 2xx for end-of-data only in the step where the MX gave a 2xx to
  the end-of-data of *that* message (each message carries a tag line);
* everything the MX receives is canonical: whole CRLF lines in command mode, bodies with
  no bare CR/LF/NUL and one CRLF.CRLF only at the very end of a send; nothing after
  DATA until the MX's 354, nothing after STARTTLS's 220 until the handshake, nothing
  after end-of-data until its reply; every command line it receives is one the client
  sent (or the proxy's own STARTTLS/QUIT): smuggled commands never become commands;
* the client never gets more replies than it is owed, plus at most one final 4xx/5xx;
* a canonical, properly stuffed message reaches the MX byte for byte.
"""

from __future__ import annotations

import re
from collections import deque

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tests.unit.relay_models import (
    PROXY_LINES,
    body_pieces,
    command_lines,
    garbage,
    mx_reply,
    one_reply,
    terminators,
    verb_of,
    verp_lines,
)
from tests.unit.smuggling import is_canonical

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import BareNewlinePolicy, RelayConfig
from mailsluice.relay.machine import Relay
from mailsluice.relay.records import SessionClosed, TranscriptChunk
from mailsluice.smtp.data import END_MARKER
from mailsluice.smtp.lines import Line, LineFramer
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.unit


class RelayMachine(RuleBasedStateMachine):
    relay: Relay
    config: RelayConfig

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000.0
        # client model
        self.owed: deque[str] = deque(["GREETING"])
        self.client_eof = False  # the client half-closed: it reads on, sends nothing
        self.units = 1  # replies the client may expect (greeting included)
        self.received = 0
        self.extra = 0
        self.client_lines: set[bytes] = set()
        self.data_outstanding = False
        self.body_mode = False
        self.body = b""  # the message so far, as the client means it
        self.unsent = b""  # its tag line, sent with the first chunk
        self.tag = 0
        self.client_bodies: dict[int, bytes] = {}
        self.said_ehlo = False
        self.script = 0  # position in MAIL, RCPT, RCPT, DATA
        # MX model
        self.connect_asked = False
        self.connected = False
        self.greeted = False
        self.mx_closed = False
        self.unanswered: deque[tuple[str, int]] = deque()
        self.mx_lines = LineFramer(4096)
        self.mx_data_pending = False
        self.mx_in_body = False
        self.mx_body = b""
        self.mx_tls = ""  # "", "expect" (220 sent), "handshake"
        self.mx_eod_ok: set[int] = set()  # tags the MX accepted in this rule
        self.mx_eod_seen: set[int] = set()
        self.seq = 0
        self.session_closed = 0
        self.close_client = 0

    # ------------------------------------------------------------ plumbing
    @initialize(
        normalize=st.booleans(),
        tls=st.booleans(),
        limit=st.sampled_from([0, 400, 100_000]),
        max_errors=st.sampled_from([50, 3]),
        opening=st.sampled_from(["greeted", "greeted", "greeted", "dialling"]),
        checks=st.booleans(),
    )
    def start(
        self, normalize: bool, tls: bool, limit: int, max_errors: int, opening: str, checks: bool
    ) -> None:
        policy = BareNewlinePolicy.NORMALIZE if normalize else BareNewlinePolicy.REJECT
        self.config = RelayConfig(
            bare_newline=policy,
            message_size_limit=limit,
            max_command_line=256,
            max_errors=max_errors,
            max_recipients=3,
            tls_checks=checks,
        )
        self.checks: list[str] = []  # CheckTlsPolicy asked, not answered yet
        self.relay = Relay(
            config=self.config,
            session_id="s",
            client="192.0.2.1:1",
            destination="198.51.100.1:25",
            tls_allowed=tls,
            now=self.now,
        )
        self.apply(self.relay.start())
        if opening == "greeted":  # most runs start in a session: steps go to the dialogue
            self.mx_connects()
            self.mx_greets(b"220 mx.example ESMTP")

    def new_mx(self) -> None:
        """The relay dials again: a new MX connection, nothing said on it yet."""
        self.connected = self.greeted = self.mx_closed = False
        self.unanswered.clear()  # the old connection's: gone with it
        self.mx_lines = LineFramer(4096)
        self.mx_data_pending = self.mx_in_body = False  # a body cut short is never a message
        self.mx_body = b""
        self.mx_tls = ""

    def step(self, event: ev.Event) -> None:
        self.now += 0.5
        actions = self.relay.handle(event, self.now)
        self.apply(actions)

    def apply(self, actions: list[act.Action]) -> None:
        closes = sum(isinstance(a, act.CloseClient) for a in actions)
        for action in actions:
            match action:
                case act.SendToServer(data):
                    self.mx_receive(data)
                case act.SendToClient(data):
                    self.client_receive(one_reply(data), closes > 0)
                case act.CloseServer():
                    self.mx_closed = True
                case act.CloseClient():
                    self.close_client += 1
                case act.ConnectServer():
                    # once, or again after we closed it mid-body (a message refused)
                    assert not self.connect_asked or (self.connected and self.mx_closed)
                    if self.connect_asked:
                        self.new_mx()
                    self.connect_asked = True
                case act.StartServerTls():
                    assert self.mx_tls == "expect", "TLS started without the MX's clean 220"
                    self.mx_tls = "handshake"
                case act.SetTimer(seconds):
                    assert seconds > 0
                case act.Log(record):
                    if isinstance(record, TranscriptChunk):
                        for line in record.expand():
                            assert line.seq == self.seq + 1
                            self.seq = line.seq
                    elif isinstance(record, SessionClosed):
                        self.session_closed += 1
                case act.TlsBroken():
                    pass
                case act.CheckTlsPolicy(domain):
                    assert not self.checks, "a second check while one is out"
                    self.checks.append(domain)
        if self.mx_tls == "expect":  # the 220 did not lead to a handshake (injection)
            assert self.relay.closed
        assert self.relay.closed == (self.close_client == 1)

    # ------------------------------------------------------------ the client side
    def client_receive(self, reply: Reply, closing: bool) -> None:
        self.received += 1
        if not self.owed:
            self.extra += 1
            assert closing, f"unowed reply {reply} and the session goes on"
            assert reply.code >= 400
            return
        kind = self.owed.popleft()
        if kind.startswith("EOD:"):
            tag = int(kind[4:])
            if reply.is_positive:
                assert tag in self.mx_eod_ok, f"2xx to message {tag} the MX did not accept"
                self.mx_eod_ok.discard(tag)
        elif kind == "DATA":
            self.data_outstanding = False
            if reply.code == 354:
                self.body_mode = True
                self.tag += 1
                self.body = self.unsent = b"X-Tag: %d\r\n" % self.tag

    def client_send(self, data: bytes) -> None:
        """Command-mode bytes: every LF is one line the client is owed a reply for."""
        for line in data.split(b"\n")[:-1]:
            self.owed.append(verb_of(line))
            self.client_lines.add(line.rstrip(b"\r"))
            self.units += 1
        self.step(ev.ClientData(data))

    def open(self) -> bool:
        return not self.relay.closed

    def sending(self) -> bool:
        """The client may still send (it has not half-closed)."""
        return self.open() and not self.client_eof

    def may_command(self) -> bool:
        return self.sending() and not self.body_mode and not self.data_outstanding

    @precondition(may_command)
    @rule(
        lines=st.lists(st.tuples(command_lines, terminators), min_size=1, max_size=4),
        early=st.booleans(),
    )
    def client_commands(self, lines: list[tuple[bytes, bytes]], early: bool) -> None:
        """Random commands, pipelined (a well-behaved client stops after DATA)."""
        if not self.greeted and not early:
            return
        group = b""
        for line, end in lines:
            group += line + end
            if line == b"DATA":
                self.data_outstanding = True
                break
        self.client_send(group)

    @precondition(may_command)
    @rule(count=st.integers(min_value=1, max_value=5), end=terminators, xverp=st.booleans())
    def client_transaction(self, count: int, end: bytes, xverp: bool) -> None:
        """The next commands of an ordinary session: EHLO, MAIL (with XVERP or not), RCPT,
        RCPT, DATA."""
        mail = b"MAIL FROM:<s@client.example>" + (b" XVERP" if xverp else b"")
        group = b""
        for _ in range(count):
            if not self.said_ehlo:
                line, self.said_ehlo = b"EHLO client.example", True
            else:
                line = [mail, b"RCPT TO:<r@mx.example>",
                        b"RCPT TO:<r2@mx.example>", b"DATA"][self.script % 4]  # fmt: skip
                self.script += 1
            group += line + (end if line != b"DATA" else b"\r\n")
            if line == b"DATA":
                self.data_outstanding = True
                break
        self.client_send(group)

    @precondition(lambda self: self.sending() and self.body_mode)
    @rule(pieces=st.lists(body_pieces, min_size=1, max_size=6))
    def client_body(self, pieces: list[bytes]) -> None:
        chunk = b"".join(pieces)
        if (b"\r\n" + self.body + chunk).find(END_MARKER) >= 0:
            return  # would end the message early in the client's own view
        self.body += chunk
        payload, self.unsent = self.unsent + chunk, b""
        self.step(ev.ClientData(payload))

    @precondition(lambda self: self.sending() and self.body_mode)
    @rule(
        pieces=st.lists(body_pieces, max_size=6),
        after=st.sampled_from([b"", b"", b"QUIT\r\n", b"MAIL FROM:<n@client.example>\r\n"]),
    )
    def client_ends_message(self, pieces: list[bytes], after: bytes) -> None:
        """The last of the message (in the same segment as the end), the end, maybe more."""
        last = b"".join(pieces)
        if (b"\r\n" + self.body + last).find(END_MARKER) < 0:
            self.body += last
            self.unsent += last
        end = END_MARKER
        whole = b"\r\n" + self.body + end
        if whole.find(END_MARKER) != len(whole) - 5:
            end = b"X" + END_MARKER
        self.body += end
        self.client_bodies[self.tag] = self.body
        self.body_mode = False
        self.owed.append(f"EOD:{self.tag}")
        self.units += 1
        self.script = 0
        for line in after.split(b"\n")[:-1]:
            self.owed.append(verb_of(line))
            self.client_lines.add(line.rstrip(b"\r"))
            self.units += 1
        if after.startswith(b"MAIL"):
            self.script = 1
        payload, self.unsent = self.unsent + end + after, b""
        self.step(ev.ClientData(payload))

    # ------------------------------------------------------------ the MX side
    def mx_receive(self, data: bytes) -> None:
        assert not self.mx_closed, "bytes sent to a closed MX connection"
        assert self.mx_tls == "", f"bytes sent during STARTTLS ({self.mx_tls}): {data!r}"
        assert is_canonical(data), data
        if self.mx_in_body:
            self.mx_body += data
            stream = b"\r\n" + self.mx_body
            end = stream.find(END_MARKER)
            if end < 0:
                return
            assert end + 5 == len(stream), "end-of-data not at the end of a send"
            tag_line = re.match(rb"X-Tag: (\d+)\r\n", self.mx_body)
            assert tag_line is not None, self.mx_body
            tag = int(tag_line.group(1))
            assert tag in self.client_bodies, "the MX got an end-of-data the client never sent"
            assert tag not in self.mx_eod_seen
            self.mx_eod_seen.add(tag)
            sent = self.client_bodies[tag]
            assert not self.must_refuse(sent), "a message that must be refused was completed"
            if is_canonical(sent):
                assert self.mx_body == sent
            self.unanswered.append(("EOD", tag))
            self.mx_in_body = False
            self.mx_body = b""
            return
        assert not self.mx_data_pending, "bytes sent before the MX's reply to DATA"
        assert all(kind != "EOD" for kind, _ in self.unanswered), "bytes before the EOD reply"
        assert data.endswith(b"\r\n"), data
        self.mx_lines.feed(data)
        while (line := self.mx_lines.next_line()) is not None:
            assert isinstance(line, Line)
            allowed = self.client_lines | PROXY_LINES
            assert line.content in allowed | verp_lines(self.client_lines), line.content
            kind = verb_of(line.content)
            self.unanswered.append((kind, 0))
            if kind == "DATA":
                self.mx_data_pending = True

    def must_refuse(self, sent: bytes) -> bool:
        """NUL, a bare CR/LF in reject mode, or over the size limit (CRLF before "." counted)."""
        limit = self.config.message_size_limit
        reject = self.config.bare_newline is BareNewlinePolicy.REJECT
        return (
            b"\x00" in sent
            or (reject and not is_canonical(sent))
            or bool(limit and len(sent) - 3 > limit)
        )

    def mx_can_answer(self) -> bool:
        return self.open() and self.greeted and not self.mx_closed and self.mx_tls == ""

    @precondition(lambda self: self.open() and self.connect_asked and not self.connected)
    @rule()
    def mx_connects(self) -> None:
        self.connected = True
        self.step(ev.ServerConnected("203.0.113.1:2"))

    @precondition(
        lambda self: self.open() and self.connected and not self.greeted and not self.mx_closed
    )
    @rule(code=st.sampled_from([b"220 mx.example ESMTP"] * 6 + [b"554 no", b"421 busy"]))
    def mx_greets(self, code: bytes) -> None:
        self.greeted = True
        self.step(ev.ServerData(code + b"\r\n"))

    @precondition(lambda self: self.mx_can_answer() and bool(self.unanswered))
    @rule(
        flavor=st.sampled_from([0] * 6 + [1, 2, 3]),
        starttls=st.booleans(),
        how_many=st.integers(min_value=1, max_value=4),
        cut=st.integers(min_value=0, max_value=200),
        inject=st.booleans(),
    )
    def mx_answers(
        self, flavor: int, starttls: bool, how_many: int, cut: int, inject: bool
    ) -> None:
        wire = b""
        for _ in range(min(how_many, len(self.unanswered))):
            kind, tag = self.unanswered.popleft()
            reply = mx_reply(kind, flavor, starttls)
            wire += reply
            if kind == "DATA":
                self.mx_data_pending = False
                self.mx_in_body = reply.startswith(b"354")
            if kind == "EOD" and reply.startswith(b"2"):
                self.mx_eod_ok.add(tag)
            if kind == "STARTTLS" and reply.startswith(b"220"):
                self.mx_tls = "expect"
                if inject:
                    wire += b"250 injected\r\n"
                break  # the MX waits for the handshake
        if self.mx_tls == "expect" or cut % 4 == 0:
            self.step(ev.ServerData(wire))
        else:
            at = cut % (len(wire) + 1)
            for part in (wire[:at], wire[at:]):
                if part and not self.relay.closed:
                    self.step(ev.ServerData(part))
        self.mx_eod_ok.clear()  # "immediately": a later step may not use this 2xx

    @precondition(lambda self: self.open() and self.mx_tls == "handshake")
    @rule(ok=st.sampled_from([True, True, False]))
    def tls_result(self, ok: bool) -> None:
        self.mx_tls = ""
        self.step(ev.TlsStarted("TLSv1.3", "X", True) if ok else ev.TlsFailed("bad"))

    @precondition(lambda self: self.open() and bool(self.checks))
    @rule(ok=st.sampled_from([True, True, False]))
    def policy_answer(self, ok: bool) -> None:
        domain = self.checks.pop()
        refusal = Reply.make(451, "4.7.5", "TLS policy not met")
        self.step(ev.TlsPolicyChecked(domain, ok, None if ok else refusal, "checked"))

    # ------------------------------------------------------------ faults
    @precondition(lambda self: self.open())
    @rule(
        go=st.sampled_from([False] * 7 + [True]),
        kind=st.sampled_from(
            [
                "connect-fails",
                "client-close",
                "client-eof",
                "mx-close",
                "timer",
                "shutdown",
                "forced",
                "garbage",
                "unsolicited",
                "talk-before-354",
                "inject-in-handshake",
            ]
        ),
        data=st.data(),
    )
    def fault(self, go: bool, kind: str, data: st.DataObject) -> None:
        """Something goes wrong (gated, so sessions usually get far first)."""
        if go:
            self.inflict(kind, data)

    def inflict(self, kind: str, data: st.DataObject) -> None:
        if kind == "connect-fails" and not self.connected:
            self.connected = self.mx_closed = True
            self.step(ev.ServerConnectFailed("refused"))
            assert self.relay.closed
        elif kind == "client-close":
            self.step(ev.ClientClosed())
        elif kind == "client-eof" and not self.client_eof:
            # a half-close: what was sent is still answered (``nothing_is_left_hanging``)
            self.client_eof = True
            mid_body = self.body_mode
            self.step(ev.ClientEof())
            # at once only when nothing is owed (the greeting, to a client that sent
            # nothing and so could never use it, is not owed)
            if self.relay.closed and not mid_body and list(self.owed) != ["GREETING"]:
                assert not self.owed, f"half-close dropped replies: {list(self.owed)}"
        elif kind == "mx-close" and self.connected and not self.mx_closed:
            self.mx_closed, self.mx_tls = True, ""
            self.step(ev.ServerClosed("reset"))
        elif kind == "timer":
            self.step(ev.TimerExpired())
        elif kind == "shutdown":
            self.step(ev.ShutdownRequested())
        elif kind == "forced":
            self.step(ev.ShutdownForced())
        elif kind == "garbage" and self.mx_can_answer():
            self.mx_closed = True
            self.step(ev.ServerData(data.draw(garbage)))
            assert self.relay.closed  # a broken MX ends the session (421 4.5.0)
        elif kind == "unsolicited" and self.mx_can_answer() and not self.unanswered:
            self.step(ev.ServerData(data.draw(st.sampled_from([b"250 hi\r\n", b"421 bye\r\n"]))))
            assert self.relay.closed
        elif kind == "talk-before-354" and self.data_outstanding and not self.client_eof:
            forwarded = self.mx_data_pending  # else DATA still waits in the relay's buffer
            self.client_send(data.draw(st.sampled_from([b"Hi\r\n", b"x\r\n.\r\n", b"QUIT\r\n"])))
            if forwarded and not self.relay.closed:
                # 554 5.5.0 is DATA's reply (RFC 2920): it waits for the replies owed before
                owed = [k for k, _ in self.unanswered].index("DATA")
                assert owed
                assert self.mx_can_answer()
                self.mx_answers(flavor=0, starttls=False, how_many=owed, cut=0, inject=False)
            assert self.relay.closed or not forwarded
        elif kind == "inject-in-handshake" and self.mx_tls == "handshake":
            self.mx_closed = True
            self.step(ev.ServerData(b"250 plaintext after 220\r\n"))
            assert self.relay.closed

    def critical(self) -> bool:
        """The MX owes the verdict on a message, or a body is streaming."""
        return self.open() and (
            self.body_mode or self.mx_in_body or any(k == "EOD" for k, _ in self.unanswered)
        )

    @precondition(critical)
    @rule(
        kind=st.sampled_from(
            ["mx-close", "timer", "forced", "client-close", "client-eof", "garbage"]
        ),
        data=st.data(),
    )
    def fault_at_the_worst_moment(self, kind: str, data: st.DataObject) -> None:
        self.inflict(kind, data)

    @precondition(lambda self: self.relay.closed)
    @rule(event=st.sampled_from(
        [ev.ClientData(b"QUIT\r\n"), ev.ServerData(b"250 ok\r\n"), ev.TimerExpired(),
         ev.ServerClosed("x"), ev.ClientClosed(), ev.ClientEof(), ev.ShutdownForced()]
    ))  # fmt: skip
    def after_the_end(self, event: ev.Event) -> None:
        assert self.relay.handle(event, self.now) == []

    # ------------------------------------------------------------ invariants
    @invariant()
    def replies_never_exceed_what_is_owed(self) -> None:
        assert self.received <= self.units + 1
        assert self.extra <= 1

    @invariant()
    def nothing_is_left_hanging(self) -> None:
        """Once the MX has answered everything it got, every client line has its reply."""
        quiet_mx = (
            not self.unanswered and not self.mx_in_body and self.mx_tls == "" and not self.checks
        )
        if self.open() and self.greeted and not self.mx_closed and quiet_mx:
            assert not self.owed, f"the client still waits for {list(self.owed)}"

    @invariant()
    def closed_once(self) -> None:
        assert self.session_closed == (1 if self.relay.closed else 0)
        assert self.close_client == (1 if self.relay.closed else 0)


RelayMachine.TestCase.settings = settings(
    max_examples=settings().max_examples,  # the loaded profile (dev, ci or deep)
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRelayStateful = RelayMachine.TestCase
