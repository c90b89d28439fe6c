"""Write the seed corpora, ``fuzz/corpus/<target>/<name>`` (run: python -m fuzz.make_corpus).

Seeds are small, valid inputs in each target's input format that reach the interesting
code at once: the fuzzer mutates from there. Regenerating overwrites these files only.
"""

from __future__ import annotations

from pathlib import Path

from fuzz import fuzz_relay as relay

ROOT = Path(__file__).resolve().parent / "corpus"

Op = tuple[int, int] | tuple[int, int, bytes]


def encode_ops(flags: int, ops: list[Op]) -> bytes:
    out = bytearray([flags])
    for op in ops:
        out += bytes(op[:2])
        if len(op) == 3:
            out += op[2]
    return bytes(out)


def line(text: bytes) -> tuple[int, int]:
    return (relay.CLIENT_LINE, relay.CLIENT_LINES.index(text))


def body(text: bytes) -> tuple[int, int]:
    return (relay.CLIENT_BODY, relay.BODY_PIECES.index(text))


SEND = (relay.CLIENT_FLUSH, 255)
ANSWER = (relay.MX_ANSWER, 0)
DELIVER = (relay.MX_FLUSH, 255)
CONNECT = (relay.CONNECT, 1)
GREET: list[Op] = [CONNECT, ANSWER, DELIVER]
EHLO: list[Op] = [line(b"EHLO client.example\r\n"), SEND, ANSWER, DELIVER]
ENVELOPE: list[Op] = [
    line(b"MAIL FROM:<a@client.example>\r\n"), SEND, ANSWER, DELIVER,
    line(b"RCPT TO:<b@mx.example>\r\n"), SEND, ANSWER, DELIVER,
    line(b"DATA\r\n"), SEND, ANSWER, DELIVER,
]  # fmt: skip
MESSAGE: list[Op] = [
    body(b"Subject: test\r\n\r\n"), body(b"hello world\r\n"), body(b"..leading dot\r\n"),
    body(b".\r\n"), SEND, ANSWER, DELIVER,
]  # fmt: skip
QUIT: list[Op] = [line(b"QUIT\r\n"), SEND, ANSWER, DELIVER, (relay.SERVER_CLOSE, 0)]

# fmt: off
RELAY: dict[str, bytes] = {
    "plain-session": encode_ops(0, [*GREET, *EHLO, *ENVELOPE, *MESSAGE, *QUIT]),
    "tls-session": encode_ops(
        2,
        [*GREET, line(b"EHLO client.example\r\n"), SEND, (relay.MX_ANSWER, 1), DELIVER,
         ANSWER, DELIVER, (relay.TLS, 1), ANSWER, DELIVER, *ENVELOPE, *MESSAGE, *QUIT],
    ),
    "pipelined": encode_ops(
        4,
        [*GREET, *EHLO, line(b"MAIL FROM:<a@client.example>\r\n"),
         line(b"RCPT TO:<b@mx.example>\r\n"), line(b"RCPT TO:<c@mx.example> NOTIFY=NEVER\r\n"),
         line(b"DATA\r\n"), SEND, ANSWER, ANSWER, (relay.MX_ANSWER, 2), ANSWER, DELIVER,
         *MESSAGE, line(b"RSET\r\n"), line(b"NOOP\r\n"), SEND, ANSWER, ANSWER, DELIVER, *QUIT],
    ),
    "smuggling-normalize": encode_ops(
        1,
        [*GREET, *EHLO, *ENVELOPE, body(b"hello world\r\n"), body(b"\n.\n"),
         body(b"MAIL FROM:<smuggled@evil.example>\r\n"), body(b"\r\n.\r\r\n"),
         body(b"\r\n.\r\n"), SEND, ANSWER, DELIVER, *QUIT],
    ),
    "smuggling-reject": encode_ops(
        0,
        [*GREET, *EHLO, *ENVELOPE, body(b"hello world\r\n"), body(b"\r.\r"),
         body(b".\r\nMAIL FROM:<smuggled@evil.example>\r\n"), body(b".\r\n"), SEND, ANSWER,
         DELIVER, *QUIT],
    ),
    "smuggling-lf-dot": encode_ops(
        0,
        [*GREET, *EHLO, *ENVELOPE, body(b"hello world\r\n"), body(b"\n.\n"),
         body(b"MAIL FROM:<smuggled@evil.example>\r\n"), body(b".\r\n"), SEND, ANSWER,
         DELIVER, ANSWER, DELIVER, *QUIT],
    ),
    "junk-tiny-limits": encode_ops(
        8,
        [*GREET, (relay.CLIENT_RAW, 40, b"x" * 38 + b"\r\n"), line(b"XYZZY\r\n"),
         line(b"STARTTLS\r\n"), line(b"BDAT 10 LAST\r\n"), SEND, SEND, SEND],
    ),
    "flood-tiny-limits": encode_ops(
        8,
        [*GREET, body(b"x" * 120), body(b"x" * 120), body(b"x" * 120), SEND, SEND, SEND,
         line(b"NOOP\r\n"), SEND],
    ),
    "refused-client": encode_ops(0x30, [line(b"EHLO client.example\r\n"), SEND]),
    "lost-after-dot": encode_ops(
        0, [*GREET, *EHLO, *ENVELOPE, *MESSAGE[:-3], SEND, (relay.SERVER_CLOSE, 0)]
    ),
    "timeout-after-dot": encode_ops(
        0, [*GREET, *EHLO, *ENVELOPE, *MESSAGE[:-3], SEND, (relay.TIMER, 0)]
    ),
    "http": encode_ops(0, [*GREET, line(b"GET / HTTP/1.1\r\n"), SEND]),
}
# fmt: on
LINES: dict[str, bytes] = {
    "commands": b"\x40\x07\x05EHLO client.example\r\nMAIL FROM:<a@b>\r\nRCPT TO:<c@d>\nDATA\r\n",
    "overlong": b"\x08\x01\x03short\r\n" + b"x" * 30 + b"\r\nafter\r\n" + b"y" * 20,
    "bare": b"\x10\x02\x01a\rb\r\r\nc\n\r\n\n",
    "cut-crlf": b"\x05\x09\x00abc\r\nabcd\r\nab\r\r\n",
}
COMMANDS: dict[str, bytes] = {
    "mail": b"MAIL FROM:<a@client.example> SIZE=1000 BODY=8BITMIME",
    "mail-null": b"mail from: <>",
    "rcpt-route": b"RCPT TO:<@relay.example:b@mx.example> NOTIFY=SUCCESS,FAILURE",
    "rcpt-quoted": b'RCPT TO:<"john doe"@mx.example>',
    "rcpt-postmaster": b"RCPT TO:postmaster",
    "ehlo": b"EHLO client.example",
    "utf8": "MAIL FROM:<jos\u00e9@b\u00fccher.example> SMTPUTF8".encode(),
    "http": b"GET / HTTP/1.1",
    "header": b"Host: mx.example",
    "data-arg": b"DATA now",
}
REPLIES: dict[str, bytes] = {
    "ehlo": b"\x07250-mx.example\r\n250-PIPELINING\r\n250-SIZE 1000\r\n250 8BITMIME\r\n",
    "mixed": b"\x03250-one\r\n550-two\r\n451 three\r\n220\r\n",
    "greeting": b"\x00220 mx.example ESMTP\r\n",
    "bad": b"\x02250-ok\r\n25O oops\r\n",
    "bare-lf": b"\x02354 go\n",
    "status": b"\x01550 5.1.1 <a@b>: unknown\r\n",
}
DATA: dict[str, bytes] = {
    "canonical": b"\x00\x00\x07\x05Subject: t\r\n\r\nhello\r\n..dot\r\n.\r\nQUIT\r\n",
    "smuggle-reject": b"\x00\x00\x03\x02hello\n.\nMAIL FROM:<x@y>\r\n.\r\n",
    "smuggle-normalize": b"\x01\x00\x03\x01hello\n.\r\n\r.\r\nx\r\n.\r\r\n.\r\n",
    "nul": b"\x01\x00\x02\x04a\x00b\r\n.\r\n",
    "too-big": b"\x02\x02\x02\x03" + b"z" * 20 + b"\r\n.\r\n",
    "empty": b"\x00\x00\x00\x00.\r\nRSET\r\n",
    "cut-marker": b"\x00\x00\x09\x00abc\r\n.\r\n",
}
EHLO_SEEDS: dict[str, bytes] = {
    "postfix": b"\x00\x03mx.example\nPIPELINING\nSIZE 10240000\nVRFY\nETRN\nSTARTTLS\n"
    b"ENHANCEDSTATUSCODES\n8BITMIME\nDSN\nSMTPUTF8\nCHUNKING",
    "rich": b"\x00\x02mx.example\nAUTH PLAIN LOGIN\nBINARYMIME\nREQUIRETLS\nXCLIENT NAME\nSIZE",
    "misplaced": b"\x00\x01SIZE 5\nSTARTTLS\nmx.example\nDSN",
    "only-keywords": b"\x00\x01PIPELINING\nSIZE 99",
    "refused": b"\x04\x00mx.example busy",
}
CORPORA = {
    "lines": LINES,
    "commands": COMMANDS,
    "replies": REPLIES,
    "data": DATA,
    "ehlo": EHLO_SEEDS,
    "relay": RELAY,
}


def main() -> None:
    for target, seeds in CORPORA.items():
        folder = ROOT / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, content in seeds.items():
            (folder / name).write_bytes(content)
        print(f"{target}: {len(seeds)} seeds in {folder}")


if __name__ == "__main__":
    main()
