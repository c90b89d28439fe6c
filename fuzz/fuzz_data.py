"""Fuzz target: ``smtp.data.BodyScanner`` (end-of-data, smuggling defence, size cap).

Input: byte 0 is the mode (bit 0: normalize instead of reject; bit 1: a size limit of
byte 1 times 4), byte 2 the segmentation seed, byte 3 the largest piece; the rest is what
the client sends after the 354. Reference: end-of-data is the first ``CRLF.CRLF`` in
``CRLF + stream``. Invariants, for the whole stream and for the pieces:

* end-of-data is reported in the piece that completes it, exactly where the reference
  finds it, and ``rest`` plus the unfed pieces is exactly what follows it;
* the bytes forwarded upstream are canonical (no NUL, no bare CR or LF), and ``CRLF.CRLF``
  occurs in ``CRLF + forwarded`` only as their very end, and only when the message is
  accepted: a refused message is never completed upstream;
* the fault is the reference one (NUL > bare CR/LF in reject mode > over the limit) and
  does not depend on the segmentation; ``size`` is the reference size;
* reject mode: forwarded bytes are always a prefix of the input (pass-through); an
  accepted message is forwarded byte for byte;
* normalize mode: an accepted message's forwarded form is the same for any segmentation,
  has one line per LF of the message, each the original line without its CR, stray CRs as
  spaces, possibly dot-stuffed once (only a line starting with a dot).
"""

from __future__ import annotations

import sys

from fuzz.harness import Reader, is_canonical, main, split
from mailsluice.smtp.data import END_MARKER, BodyFault, BodyScanner


def _scan(
    pieces: list[bytes], normalize: bool, limit: int
) -> tuple[BodyScanner, bytes, bytes, bool]:
    """Feed pieces until end-of-data: (scanner, forwarded, rest after the end, done)."""
    scanner = BodyScanner(normalize=normalize, size_limit=limit)
    forwarded = b""
    for index, piece in enumerate(pieces):
        chunk = scanner.feed(piece)
        forwarded += chunk.forward
        if not chunk.done:
            assert chunk.rest == b"", chunk
            assert END_MARKER not in b"\r\n" + forwarded, forwarded
            continue
        return scanner, forwarded, chunk.rest + b"".join(pieces[index + 1 :]), True
    return scanner, forwarded, b"", False


def _expected_fault(message: bytes, normalize: bool, limit: int) -> BodyFault | None:
    if b"\x00" in message:
        return BodyFault.NUL
    if not normalize and not is_canonical(message):
        return BodyFault.BARE_NEWLINE
    if limit and len(message) > limit:
        return BodyFault.TOO_BIG
    return None


def _check_normalized(message: bytes, forwarded: bytes) -> None:
    lines_in = message.split(b"\n")
    assert lines_in[-1] == b"", message  # the message ends with the terminator's CRLF
    lines_out = forwarded[: -len(b".\r\n")].split(b"\r\n")
    assert lines_out[-1] == b"", forwarded
    assert len(lines_out) == len(lines_in), (message, forwarded)
    for raw, out in zip(lines_in[:-1], lines_out[:-1], strict=True):
        plain = (raw[:-1] if raw.endswith(b"\r") else raw).replace(b"\r", b" ")
        assert out == plain or (plain.startswith(b".") and out == b"." + plain), (raw, out)


def _check(stream: bytes, pieces: list[bytes], normalize: bool, limit: int) -> bytes | None:
    scanner, forwarded, rest, done = _scan(pieces, normalize, limit)
    assert is_canonical(forwarded), forwarded
    if not normalize:
        assert stream.startswith(forwarded), f"forwarded is not the input: {forwarded!r}"
    end = (b"\r\n" + stream).find(END_MARKER)
    assert done == (end >= 0), f"end-of-data: scanner {done}, reference at {end}"
    if not done:
        return None
    message = stream[:end]  # includes the CRLF that ends the last line (0 bytes if empty)
    assert rest == stream[end + 3 :], (rest, stream[end + 3 :])
    assert scanner.size == max(end - 2, 0), (scanner.size, end)
    fault = _expected_fault(message, normalize, limit)
    assert scanner.fault is fault, (scanner.fault, fault)
    marker = (b"\r\n" + forwarded).find(END_MARKER)
    if fault is not None:
        assert marker < 0, f"refused message completed upstream: {forwarded!r}"
        return None
    assert marker == len(forwarded) - 3, f"end-of-data not at the end: {forwarded!r}"
    if is_canonical(message):
        assert forwarded == message + b".\r\n", (message, forwarded)
    else:
        _check_normalized(message, forwarded)
    return forwarded


def test_one_input(data: bytes) -> None:
    reader = Reader(data)
    mode = reader.byte()
    normalize = bool(mode & 1)
    limit = reader.byte() * 4 if mode & 2 else 0
    seed = reader.byte()
    max_piece = 1 + reader.byte() % 32
    stream = reader.rest()
    whole = _check(stream, [stream], normalize, limit)
    pieces = _check(stream, split(stream, seed, max_piece), normalize, limit)
    assert pieces == whole, f"segmentation changed the forwarded message: {whole!r} {pieces!r}"


if __name__ == "__main__":
    main(test_one_input)
    sys.exit(0)
