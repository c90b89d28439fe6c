"""Fuzz target: the relay state machine (``relay.machine.Relay``), end to end.

Input: byte 0 picks the configuration (bit 0 normalize, bit 1 TLS allowed, bit 2 header
logging, bit 3 tiny limits, bits 4+5 a refused client); then operations of two bytes
(opcode, argument), the raw ones followed by ``argument`` bytes. The operations are what
the client, the MX and the I/O shell may do: queue a command line, raw bytes or a body
piece at the client and deliver up to 256 of its bytes (through ``Relay.client_data``,
the shell's hot path, or ``handle(ClientData)``, by the argument's parity); have the MX
answer its oldest command (``relay_model``) or queue raw bytes and deliver them (the
same two ways); connect, TLS result,
timer, either side closing, shutdown, an internal error. Events the shell could not
produce in the current state (data before connect, a TLS result nobody asked for, client
data while the shell has paused reading) are skipped.

Invariants, after every event:

* the relay never raises; it sends to the MX only while connected and not in a TLS
  handshake, to the client only before closing it; it dials again only when no MX
  connection is open (after a message it refused mid-body);
* everything sent to the client is whole, well-formed replies; the client gets the
  replies it is owed in order, and at most one more, which must end the session;
* **a 2xx reaches the client for end-of-data only when the MX gave a 2xx to that
  message's end-of-data**: the reply carries the MX's token, once, and the MX stored that
  very message (byte for byte, or as normalised when normalize mode changed it); even
  with a tainted MX, never more such 2xx than end-of-data markers sent upstream;
* the MX receives only canonical command lines the client sent (or the proxy's STARTTLS,
  QUIT), nothing after DATA/EHLO/STARTTLS/QUIT/end-of-data before their reply, bodies
  only after its 354, and a body end only at the very end;
* bounded state: the reply FIFO stays within ``max_in_flight`` (+2), the client backlog
  within ``max_pending_input`` plus one delivery; when the relay closes, both sides are
  closed, and later events produce no action.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from fuzz.harness import Reader, is_canonical, main, parse_replies
from fuzz.relay_model import TOKEN, ClientModel, MxModel
from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay.config import BareNewlinePolicy, RelayConfig
from mailsluice.relay.machine import Relay
from mailsluice.smtp.data import END_MARKER
from mailsluice.smtp.replies import Reply

CLIENT_LINES = (
    b"EHLO client.example\r\n",
    b"HELO client.example\r\n",
    b"MAIL FROM:<a@client.example>\r\n",
    b"MAIL FROM:<> SIZE=100\r\n",
    b"MAIL FROM:<big@client.example> SIZE=999999999\r\n",
    b"RCPT TO:<b@mx.example>\r\n",
    b"RCPT TO:<c@mx.example> NOTIFY=NEVER\r\n",
    b"DATA\r\n",
    b"RSET\r\n",
    b"NOOP\r\n",
    b"QUIT\r\n",
    b"STARTTLS\r\n",
    b"BDAT 10 LAST\r\n",
    b"AUTH PLAIN AGF1dGg=\r\n",
    b"VRFY postmaster\r\n",
    b"GET / HTTP/1.1\r\n",
    b"XYZZY\r\n",
    b"mail from: <a@b.example>\r\n",
    b"RCPT TO:<>\r\n",
    b"EHLO\r\n",
    b"DATA\n",
    b"RCPT TO:<d@mx.example>\n",
)
BODY_PIECES = (
    b"Subject: test\r\n\r\n",
    b"hello world\r\n",
    b".\r\n",
    b"\r\n.\r\n",
    b"..leading dot\r\n",
    b"\n.\n",
    b"\r.\r",
    b"\n.\r\n",
    b"\r\n.\n",
    b"\r\n.\r\r\n",
    b"\x00",
    b"\r",
    b"\n",
    b"x" * 120,
    b"MAIL FROM:<smuggled@evil.example>\r\n",
    b".\r\nMAIL FROM:<smuggled@evil.example>\r\n",
)
TINY = {
    "max_command_line": 64,
    "max_reply_line": 128,
    "max_reply_lines": 4,
    "max_pending_input": 200,
    "max_in_flight": 3,
    "max_errors": 3,
    "message_size_limit": 300,
    "max_recipients": 2,
    "max_logged_headers": 64,
}
CHUNK = 256  # most bytes one delivery carries
(CLIENT_LINE, CLIENT_RAW, CLIENT_BODY, CLIENT_FLUSH, MX_ANSWER, MX_RAW, MX_FLUSH, CONNECT,
 TLS, TIMER, CLIENT_CLOSE, SERVER_CLOSE, SHUTDOWN, INTERNAL) = range(14)  # fmt: skip
OPCODES = 14


class Session:
    """One relay between a ``ClientModel`` and an ``MxModel``, as the shell drives it."""

    def __init__(self, config: RelayConfig, tls_allowed: bool, refusal: Reply | None) -> None:
        self.config = config
        self.client = ClientModel(config.max_command_line)
        self.mx = MxModel(config.max_command_line)
        self.client_out = bytearray()
        self.connect_asked = self.connect_done = False
        self.server_open = False  # connected, not closed by either side
        self.client_open = True  # the relay has not closed the client
        self.client_gone = False  # the client closed
        self.client_eof = False  # the client half-closed: it reads on, sends nothing
        self.tls_asked = False  # StartServerTls out, no result yet
        self.acknowledged: set[bytes] = set()
        self.upstream_tail = b""  # the last bytes sent to the MX
        self.dots_sent = 0  # end-of-data markers sent to the MX
        self.dots_acknowledged = 0  # 2xx replies the client got for its end-of-data
        self.now = 1_000.0
        self.relay = Relay(
            config=config,
            session_id="fuzz",
            client="192.0.2.10:40000",
            destination="198.51.100.25:25",
            source_ip="203.0.113.5",
            tls_allowed=tls_allowed,
            refusal=refusal,
            now=self.now,
        )
        self.perform(self.relay.start())

    def new_mx(self) -> None:
        """Another MX connection: a fresh MX model that keeps what the last one stored."""
        stored, completed = self.mx.stored, self.mx.completed
        self.mx = MxModel(self.config.max_command_line)
        self.mx.stored, self.mx.completed = stored, completed
        self.tls_asked = False
        self.upstream_tail = b""

    def event(self, event: ev.Event) -> None:
        self.now += 1.0
        self.perform(self.relay.handle(event, self.now))

    def data(self, from_client: bool, data: bytes, hot: bool) -> None:
        """Bytes from one side, through the shell's hot path or as an event (both exist)."""
        method = getattr(self.relay, "client_data" if from_client else "server_data", None)
        if not hot or method is None:
            self.event(ev.ClientData(data) if from_client else ev.ServerData(data))
            return
        self.now += 1.0
        self.perform(method(data, self.now))

    def perform(self, actions: Sequence[act.Action]) -> None:
        extra = self.client.extra
        for action in actions:
            match action:
                case act.SendToClient(data):
                    assert self.client_open, f"sent to the client after closing it: {data!r}"
                    for reply in parse_replies(data):
                        if not self.client_gone:
                            self.client_reply(reply)
                case act.SendToServer(data):
                    assert self.server_open, f"sent to an MX not connected: {data!r}"
                    assert not self.tls_asked, f"sent during the TLS handshake: {data!r}"
                    self.mx.receive(data, self.client.lines_sent)
                    stream = self.upstream_tail + data
                    self.dots_sent += stream.endswith(END_MARKER)
                    self.upstream_tail = stream[-len(END_MARKER) :]
                case act.CloseServer():
                    self.server_open = False
                case act.CloseClient():
                    self.client_open = False
                case act.ConnectServer():
                    assert not self.server_open, "ConnectServer with an MX connection open"
                    assert self.connect_done or not self.connect_asked, "ConnectServer twice"
                    if self.connect_done:  # dialled again (after a message refused mid-body)
                        self.new_mx()
                    self.connect_asked, self.connect_done = True, False
                case act.StartServerTls():
                    assert self.server_open, "StartServerTls with no MX connection"
                    assert not self.tls_asked, "StartServerTls twice"
                    self.tls_asked = True
                case act.SetTimer(seconds, _):
                    assert seconds > 0, action
        if self.client.extra > extra:
            assert not self.client_open, "an unasked reply without ending the session"
        if self.relay.closed:
            assert not self.client_open, "closed with the client connection open"
            assert not self.server_open, "closed with the MX connection open"
        pending = self.relay.replies_owed  # the memory a pipelining client can grow
        assert pending <= 2 * self.config.max_in_flight + 4, f"reply queues grew to {pending}"

    def client_reply(self, reply: Reply) -> None:
        answered = self.client.on_reply(reply, self.mx.tainted)
        if answered is None or answered[0] != "EOD" or not reply.is_positive:
            return
        message = answered[1]
        self.dots_acknowledged += 1
        sent = self.dots_sent
        assert self.dots_acknowledged <= sent, f"2xx for an end-of-data never sent: {reply}"
        found = TOKEN.search(b"\n".join(reply.lines))
        if found is None:  # a tainted MX may have sent a 2xx the relay took for this reply
            assert self.mx.tainted, f"2xx to end-of-data the MX did not give: {reply}"
            return
        token = found.group(1)
        assert token in self.mx.stored, f"unknown MX token: {reply}"
        assert token not in self.acknowledged, f"one MX acceptance acknowledged twice: {reply}"
        self.acknowledged.add(token)
        if self.mx.tainted:
            return
        stored = self.mx.stored[token]
        policy = self.config.bare_newline
        if policy is BareNewlinePolicy.REJECT or is_canonical(message):
            assert stored == message, f"2xx for another message: {message!r} vs {stored!r}"
        else:
            lines = stored.count(b"\r\n") == message.count(b"\n")
            assert lines, f"2xx for another message: {message!r} vs {stored!r}"

    # ---------------------------------------------------------------- operations
    def run(self, op: int, arg: int, payload: bytes) -> None:
        if op == CLIENT_LINE:
            self.client_out += CLIENT_LINES[arg % len(CLIENT_LINES)]
        elif op == CLIENT_RAW:
            self.client_out += payload
        elif op == CLIENT_BODY:
            self.client_out += BODY_PIECES[arg % len(BODY_PIECES)]
        elif op == CLIENT_FLUSH:
            backlog_ok = self.relay.client_backlog <= self.config.max_pending_input
            sending = self.client_open and not self.client_gone and not self.client_eof
            if sending and self.client_out and backlog_ok:
                data = bytes(self.client_out[: 1 + arg])
                del self.client_out[: len(data)]
                self.client.deliver(data)
                self.data(True, data, hot=arg % 2 == 0)
                limit = self.config.max_pending_input + CHUNK
                assert self.relay.client_backlog <= limit, self.relay.client_backlog
        elif op == MX_ANSWER:
            if self.server_open:  # an MX exists (its first reply is the greeting)
                self.mx.answer(arg)
        elif op == MX_RAW:
            if self.server_open:
                self.mx.raw(payload)
        elif op == MX_FLUSH:
            if self.server_open and self.mx.outbox:
                self.data(False, self.mx.take(1 + arg), hot=arg % 2 == 0)
        elif op == CONNECT:
            if self.connect_asked and not self.connect_done:
                self.connect_done = True
                if arg % 8:
                    self.server_open = True
                    self.mx.unanswered.append(("GREETING", b""))
                    self.event(ev.ServerConnected("203.0.113.5:50000"))
                else:
                    self.event(ev.ServerConnectFailed("connection refused"))
        else:
            self.run_shell(op, arg)

    def run_shell(self, op: int, arg: int) -> None:
        if op == TLS:
            if self.tls_asked and self.server_open:
                self.tls_asked = False
                if arg % 4:
                    self.mx.tls_started()
                    self.event(ev.TlsStarted("TLSv1.3", "TLS_AES_256_GCM_SHA384", bool(arg & 4)))
                else:
                    self.event(ev.TlsFailed("handshake failure"))
        elif op == TIMER:
            self.event(ev.TimerExpired())
        elif op == CLIENT_CLOSE:
            if self.client_open and not self.client_gone and arg & 1 and not self.client_eof:
                self.client_eof = True  # a half-close: the replies owed still come
                self.event(ev.ClientEof())
            elif self.client_open and not self.client_gone:
                self.client_gone = True
                self.event(ev.ClientClosed())
        elif op == SERVER_CLOSE:
            if self.server_open:
                self.server_open = False
                self.event(ev.ServerClosed("connection reset by peer"))
        elif op == SHUTDOWN:
            self.event(ev.ShutdownForced() if arg & 1 else ev.ShutdownRequested())
        elif op == INTERNAL and arg == 0:
            self.event(ev.InternalError("fuzz"))


def make_config(flags: int) -> RelayConfig:
    policy = BareNewlinePolicy.NORMALIZE if flags & 1 else BareNewlinePolicy.REJECT
    if flags & 8:
        return RelayConfig(bare_newline=policy, log_headers=bool(flags & 4), **TINY)  # type: ignore[arg-type]
    return RelayConfig(bare_newline=policy, log_headers=bool(flags & 4))


def test_one_input(data: bytes) -> None:
    reader = Reader(data)
    flags = reader.byte()
    refusal = Reply.make(554, "5.7.1", "Error: not allowed") if flags & 0x30 == 0x30 else None
    session = Session(make_config(flags), bool(flags & 2), refusal)
    while reader.remaining and not session.relay.closed:
        op = reader.byte() % OPCODES
        arg = reader.byte()
        payload = reader.take(arg) if op in (CLIENT_RAW, MX_RAW) else b""
        session.run(op, arg, payload)
    if session.relay.closed:  # a closed relay ignores whatever still comes in
        for event in (ev.ClientData(b"NOOP\r\n"), ev.ServerData(b"250 ok\r\n"), ev.TimerExpired()):
            assert session.relay.handle(event, session.now) == [], f"acted after closing: {event}"


if __name__ == "__main__":
    main(test_one_input)
    sys.exit(0)
