"""Models for the Relay state machine test: what the client says, how the MX answers."""

from __future__ import annotations

from hypothesis import strategies as st
from tests.unit.smuggling import CATALOGUE, SMUGGLED

from mailsluice.smtp.lines import Line, LineFramer
from mailsluice.smtp.replies import Reply, ReplyAssembler

# the proxy's own; "EHLO mailsluice": the set-up of a connection dialled again (after a
# message refused mid-body) for a client that never said EHLO
PROXY_LINES = {b"STARTTLS", b"QUIT", b"EHLO mailsluice"}
COMMANDS = [
    b"EHLO client.example",
    b"HELO client.example",
    b"MAIL FROM:<s@client.example>",
    b"MAIL FROM:<>",
    b"mail from: <s@client.example> BODY=8BITMIME",
    b"MAIL FROM:<s@client.example> SIZE=999999999",
    b"MAIL FROM:<s@client.example> XVERP",
    b"MAIL FROM:<s@client.example> XVERP=-=",
    b"MAIL FROM:<> XVERP",
    b"RCPT TO:<r@mx.example>",
    b"RCPT TO:<r2@mx.example> NOTIFY=NEVER",
    b"RCPT TO:<>",
    b"DATA",
    b"RSET",
    b"NOOP",
    b"VRFY postmaster",
    b"XFOO",
    b"STARTTLS",
    b"AUTH PLAIN c2VjcmV0",
    b"RCPT TO:<a@b.example>\rDATA",
    b"NOOP " + b"x" * 300,
    b"",
    b"QUIT",
    b"BDAT 5 LAST",
    b"GET / HTTP/1.1",
]


def verp_lines(client_lines: set[bytes]) -> set[bytes]:
    """The MAIL lines the proxy may send for the client's XVERP MAILs: the sender's
    return path for each recipient the client named."""
    delimiters = {b"+=" if line.endswith(b"XVERP") else line[-2:]
                  for line in client_lines if b"XVERP" in line and b"<s@" in line}  # fmt: skip
    recipients = [b"r", b"r2"]
    return {
        b"MAIL FROM:<s" + d[:1] + r + d[1:] + b"mx.example@client.example>"
        for d in delimiters
        for r in recipients
    }


RARE = {b"QUIT", b"BDAT 5 LAST", b"GET / HTTP/1.1"}  # end the session: drawn less often
command_lines = st.sampled_from([c for c in COMMANDS if c not in RARE] * 4 + sorted(RARE))
terminators = st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n"])
body_pieces = st.one_of(
    st.sampled_from(CATALOGUE),
    st.sampled_from(CATALOGUE),
    st.sampled_from([b"\r\n", b"text", b".", b"..", b"\r\n..\r\n", b"\x00", b"\n", b"\r"]),
    st.just(SMUGGLED),
    st.binary(max_size=20),
    st.just(b"x" * 120 + b"\r\n"),
)
garbage = st.one_of(
    st.binary(max_size=30).map(lambda b: b"\x01not a reply\r\n" + b),
    st.sampled_from([b"550 no\n250 ok\r\n", b"HTTP/1.1 200 OK\r\n", b"250 a\x00\r\n", b"2" * 3000]),
)
EHLO_BASE = [b"mx.example", b"PIPELINING", b"SIZE 100000", b"8BITMIME"]


def verb_of(line: bytes) -> str:
    text = line.rstrip(b"\r")
    if text.upper() == b"DATA":
        return "DATA"
    return text.split(b" ", 1)[0].decode("ascii", "replace").upper() or "?"


def one_reply(data: bytes) -> Reply:
    framer = LineFramer(4096)
    framer.feed(data)
    assembler = ReplyAssembler()
    replies = []
    while (line := framer.next_line()) is not None:
        assert isinstance(line, Line)
        assert not line.bare_lf
        reply = assembler.add_line(line.content)
        if reply is not None:
            replies.append(reply)
    assert framer.buffered == 0
    assert len(replies) == 1, data
    return replies[0]


def mx_reply(kind: str, flavor: int, starttls: bool) -> bytes:
    """The MX model's reply to ``kind``: flavor 0 is the usual one, 3 the odd one."""
    if kind in ("EHLO",):
        if flavor == 3:
            return b"502 5.5.1 no EHLO\r\n"
        lines = EHLO_BASE + ([b"STARTTLS"] if starttls else []) + [b"CHUNKING"]
        return Reply(250, tuple(lines)).to_bytes()
    table = {
        "STARTTLS": [b"220 2.0.0 go", b"220 2.0.0 go", b"454 4.7.0 no TLS", b"220 2.0.0 go"],
        "DATA": [b"354 go", b"354 go", b"554 5.5.1 no recipients", b"250 odd"],
        "EOD": [b"250 2.0.0 queued", b"451 4.3.0 later", b"554 5.7.1 spam", b"354 odd"],
        "QUIT": [b"221 2.0.0 bye"] * 4,
    }
    default = [b"250 2.0.0 ok", b"250-ok\r\n250 2.0.0 ok", b"550 5.1.1 no", b"421 4.3.0 bye"]
    return table.get(kind, default)[flavor] + b"\r\n"
