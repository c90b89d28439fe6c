"""Fuzz target: ``smtp.replies.ReplyAssembler`` (and ``Reply`` serialisation).

Input: byte 0 picks the line cap (1..8 lines per reply), the rest is what an MX sends,
framed by a ``LineFramer`` as the relay frames it. Each line goes to ``add_line`` until
the first ``ReplySyntaxError`` (the relay then drops the MX). Invariants:

* a line is refused exactly when it is not ``[2-5]dd`` + (nothing | space | hyphen + text
  without control characters), ends with a bare LF, or exceeds the line cap;
* each reply is the texts of its lines, with the code of its last line;
  ``in_progress`` is true exactly between a hyphen line and the reply's last line;
* ``Reply.to_bytes()`` is CRLF-only, every line carries the code, and it parses back to
  the same reply; ``text``, ``transcript`` and ``enhanced_status`` never raise.
"""

from __future__ import annotations

import re
import sys

from fuzz.harness import Reader, main, parse_replies
from mailsluice.smtp.lines import LineFramer, LineTooLong
from mailsluice.smtp.replies import Reply, ReplyAssembler, ReplySyntaxError

_LINE = re.compile(rb"([2-5][0-9][0-9])(?:([ -])([^\x00-\x08\x0a-\x1f\x7f]*))?", re.S)


def check_reply(reply: Reply, texts: list[bytes], code: int) -> None:
    assert reply.code == code, (reply, code)
    assert list(reply.lines) == texts, (reply, texts)
    wire = reply.to_bytes()
    assert wire.count(b"\r\n") == wire.count(b"\n") == wire.count(b"\r") == len(texts), wire
    assert all(line.startswith(b"%d" % code) for line in wire.split(b"\r\n")[:-1]), wire
    assert parse_replies(wire) == [reply], wire
    assert isinstance(reply.text, str)
    assert isinstance(reply.transcript(), str)
    status = reply.enhanced_status
    assert status is None or re.fullmatch(r"[245]\.\d{1,3}\.\d{1,3}", status), status


def test_one_input(data: bytes) -> None:
    reader = Reader(data)
    max_lines = 1 + reader.byte() % 8
    framer = LineFramer(512)
    framer.feed(reader.rest())
    assembler = ReplyAssembler(max_lines)
    texts: list[bytes] = []
    while (item := framer.next_line()) is not None:
        if isinstance(item, LineTooLong):
            return  # the relay drops the MX without asking the assembler
        match = _LINE.fullmatch(item.content)
        valid = match is not None and not item.bare_lf and len(texts) < max_lines
        try:
            reply = assembler.add_line(item.content, item.bare_lf)
        except ReplySyntaxError:
            assert not valid, f"well-formed line refused: {item!r} after {texts!r}"
            return
        assert valid, f"garbled line accepted: {item!r}"
        assert match is not None
        texts.append(match.group(3) or b"")
        if match.group(2) == b"-":
            assert reply is None, (item, reply)
            assert assembler.in_progress, item
        else:
            assert reply is not None, item
            assert not assembler.in_progress, item
            check_reply(reply, texts, int(match.group(1)))
            texts = []


if __name__ == "__main__":
    main(test_one_input)
    sys.exit(0)
