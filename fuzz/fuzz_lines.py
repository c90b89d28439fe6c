"""Fuzz target: ``smtp.lines.LineFramer``.

Input: byte 0 picks the line limit (3..258), byte 1 the segmentation seed, byte 2 the
largest piece; the rest is the stream, fed once whole and once in pieces.
Invariants, for both feeds:

* the items rejoin to the input: each ``Line`` is the next input bytes (content plus CRLF
  or LF), each ``LineTooLong`` stands for exactly one line longer than the limit (its
  bytes skipped up to and including its LF), and what is left is ``take_rest()``;
* no line is longer than the limit (terminator included); a bare-LF line never ends in CR;
* after every drain, the buffer holds exactly the open line if it is under the limit, and
  nothing otherwise (``discarded`` then counts all of it): memory is bounded by the limit;
* the item sequence does not depend on the segmentation.
"""

from __future__ import annotations

import sys

from fuzz.harness import Reader, main, split
from mailsluice.smtp.lines import Line, LineFramer, LineTooLong

Item = Line | LineTooLong


def _check_state(framer: LineFramer, fed: bytes, max_line: int) -> None:
    open_line = len(fed) - (fed.rfind(b"\n") + 1)
    if open_line < max_line:
        assert framer.buffered == open_line, (framer.buffered, open_line)
        assert framer.discarded == 0, framer.discarded
    else:  # an overlong line is being skipped: nothing of it is held
        assert framer.buffered == 0, (framer.buffered, open_line)
        assert framer.discarded == open_line, (framer.discarded, open_line)


def _frame(pieces: list[bytes], max_line: int) -> tuple[list[Item], bytes]:
    framer = LineFramer(max_line)
    items: list[Item] = []
    fed = b""
    for piece in pieces:
        framer.feed(piece)
        fed += piece
        while (item := framer.next_line()) is not None:
            items.append(item)
        _check_state(framer, fed, max_line)
    return items, framer.take_rest()


def _rejoin(stream: bytes, items: list[Item], rest: bytes, max_line: int) -> None:
    at = 0
    for item in items:
        if isinstance(item, Line):
            assert b"\n" not in item.content, item
            raw = item.content + (b"\n" if item.bare_lf else b"\r\n")
            if item.bare_lf:
                assert not item.content.endswith(b"\r"), item
            assert len(raw) <= max_line, (len(raw), max_line)
            assert stream[at : at + len(raw)] == raw, (at, item, stream[at : at + len(raw)])
            at += len(raw)
        else:
            assert item.limit == max_line, item
            end = stream.find(b"\n", at)
            length = (end + 1 if end >= 0 else len(stream)) - at
            assert length > max_line or (end < 0 and length >= max_line), (at, length, max_line)
            at += length
    open_line = stream[at:]
    assert b"\n" not in open_line, (at, open_line)
    if len(open_line) < max_line:
        assert rest == open_line, (rest, open_line)
    else:
        assert rest == b"", rest


def test_one_input(data: bytes) -> None:
    reader = Reader(data)
    max_line = 3 + reader.byte()
    seed = reader.byte()
    max_piece = 1 + reader.byte() % 64
    stream = reader.rest()
    whole = _frame([stream], max_line)
    _rejoin(stream, *whole, max_line)
    pieces = _frame(split(stream, seed, max_piece), max_line)
    _rejoin(stream, *pieces, max_line)
    assert pieces == whole, (pieces, whole)


if __name__ == "__main__":
    main(test_one_input)
    sys.exit(0)
