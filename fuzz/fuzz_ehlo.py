"""Fuzz target: ``smtp.ehlo`` (reading the MX's capabilities, editing the client's list).

Input: byte 0 picks the reply code, byte 1 our size limit; the rest, split at LF, are the
reply's lines, as the ``ReplyAssembler`` would hand them over (no control characters, at
most ``max_reply_line`` bytes, at most 100 lines). Invariants:

* ``keywords`` and ``edit_for_client`` never raise; keywords are upper case;
* a non-2xx reply is passed unchanged;
* a 2xx reply keeps its code and its greeting line (the first line that is not a
  misplaced keyword); every other line is an allowlisted keyword (so never STARTTLS,
  CHUNKING, BINARYMIME, REQUIRETLS, AUTH, XCLIENT), in the MX's order (lines before the
  greeting counted after it), taken verbatim
  except SIZE, which is clamped to 1..limit when we have a limit;
* the greeting and the extension lines together are the MX's lines (nothing invented);
* editing is idempotent, and the edited reply serialises to a well-formed reply.
"""

from __future__ import annotations

import re
import sys

from fuzz.harness import Reader, main, parse_replies
from mailsluice.relay.config import RelayConfig
from mailsluice.smtp.ehlo import PASSED_KEYWORDS, edit_for_client, keywords
from mailsluice.smtp.replies import Reply

CODES = (250, 250, 250, 220, 421, 450, 500, 502, 550, 554)
LIMITS = (0, 1, 1000, 10_240_000, 52_428_800, 2**40)
_MISPLACED = {"STARTTLS", "PIPELINING", "8BITMIME", "SIZE", "CHUNKING", "SMTPUTF8"}
_BAD_TEXT = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_MAX_TEXT = RelayConfig().max_reply_line - len(b"250-\r\n")


def _word(line: bytes) -> str:
    return line.split(b" ", 1)[0].decode("ascii", "replace").upper()


def check_edit(reply: Reply, limit: int) -> Reply:
    offered = keywords(reply)
    assert all(key == key.upper() for key in offered), offered
    edited = edit_for_client(reply, limit)
    if not reply.is_positive:
        assert edited == reply, (reply, edited)
        return edited
    assert edited.code == reply.code, edited
    lines = reply.lines
    at = next((i for i, line in enumerate(lines) if _word(line) not in _MISPLACED), None)
    assert edited.lines[0] == lines[at or 0], edited
    # the MX's other lines, in its order (lines put before the greeting count as after it)
    others = list(lines[1:] if at is None else lines[at + 1 :] + lines[:at])
    position = 0
    for line in edited.lines[1:]:
        word = _word(line)
        assert word in PASSED_KEYWORDS, f"{word} passed to the client: {edited!r}"
        if word == "SIZE" and limit:
            value = line[len(b"SIZE ") :]
            assert line.startswith(b"SIZE "), line
            assert value.isdigit(), line
            assert 0 < int(value) <= limit, (line, limit)
            found = next(i for i in range(position, len(others)) if _word(others[i]) == "SIZE")
        else:
            found = others.index(line, position)  # verbatim, in the MX's order
        position = found + 1
    assert edit_for_client(edited, limit) == edited, "editing is not idempotent"
    assert parse_replies(edited.to_bytes()) == [edited], edited
    return edited


def test_one_input(data: bytes) -> None:
    reader = Reader(data)
    code = CODES[reader.byte() % len(CODES)]
    limit = LIMITS[reader.byte() % len(LIMITS)]
    texts = [_BAD_TEXT.sub(b"", line)[:_MAX_TEXT] for line in reader.rest().split(b"\n")]
    check_edit(Reply(code, tuple(texts[:100])), limit)


if __name__ == "__main__":
    main(test_one_input)
    sys.exit(0)
