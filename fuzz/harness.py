"""Shared pieces of the fuzz targets: a byte reader, segmentation, and the atheris entry.

Nothing here imports atheris at module level: the targets stay importable (and testable
by pytest) on a machine without it. ``main`` imports it when a target is run as a script.
"""

from __future__ import annotations

import gc
import importlib
import os
import random
import sys
import types
from collections.abc import Callable

from mailsluice.smtp.lines import Line, LineFramer
from mailsluice.smtp.replies import Reply, ReplyAssembler

TestOneInput = Callable[[bytes], None]


class Reader:
    """Consume a fuzz input as small integers and byte strings; past the end, zeros."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def byte(self) -> int:
        if self._pos >= len(self._data):
            return 0
        value = self._data[self._pos]
        self._pos += 1
        return value

    def take(self, count: int) -> bytes:
        piece = self._data[self._pos : self._pos + count]
        self._pos += len(piece)
        return piece

    def rest(self) -> bytes:
        return self.take(self.remaining)


def suppressed(bug: str) -> bool:
    """A known bug (fuzz/crashes/README.md) whose invariant this run skips.

    ``MAILSLUICE_FUZZ_SUPPRESS=id[,id]`` (``scripts/fuzz --suppress``) lets a long run look
    past a bug already on file; nothing is suppressed by default, so CI keeps failing on it.
    """
    return bug in os.environ.get("MAILSLUICE_FUZZ_SUPPRESS", "").split(",")


def split(data: bytes, seed: int, max_piece: int) -> list[bytes]:
    """Cut ``data`` into pieces of 1..``max_piece`` bytes at points derived from ``seed``."""
    rng = random.Random(seed)
    pieces: list[bytes] = []
    at = 0
    while at < len(data):
        size = rng.randint(1, max(1, max_piece))
        pieces.append(data[at : at + size])
        at += size
    return pieces


def is_canonical(wire: bytes) -> bool:
    """CRLF line ends only, no NUL (what the MX may be sent)."""
    return b"\x00" not in wire and wire.count(b"\r") == wire.count(b"\r\n") == wire.count(b"\n")


def parse_replies(data: bytes) -> list[Reply]:
    """The replies in ``data``, which must be complete and well formed (else AssertionError)."""
    framer = LineFramer(1 << 20)
    framer.feed(data)
    assembler = ReplyAssembler(1 << 20)
    out: list[Reply] = []
    while (line := framer.next_line()) is not None:
        assert isinstance(line, Line)
        assert not line.bare_lf, f"reply line ended with a bare LF: {data!r}"
        reply = assembler.add_line(line.content)
        if reply is not None:
            out.append(reply)
    assert not assembler.in_progress, f"incomplete multi-line reply: {data!r}"
    assert framer.buffered == 0, f"reply bytes without a line end: {data!r}"
    return out


def _instrument(package: str) -> int:
    """Add atheris coverage instrumentation to every function of ``package`` (loaded)."""
    atheris = importlib.import_module("atheris")
    count = 0
    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType) and (
            (obj.__module__ or "") == package or (obj.__module__ or "").startswith(package + ".")
        ):
            atheris.instrument_func(obj)
            count += 1
    return count


def main(test_one_input: TestOneInput) -> None:
    """Run ``test_one_input`` under atheris/libFuzzer with the command line's flags."""
    try:
        atheris = importlib.import_module("atheris")
    except ImportError:
        sys.exit("fuzz: atheris is not installed: .venv/bin/pip install 'atheris>=2.3'")
    count = _instrument("mailsluice")
    print(f"INFO: instrumented {count} mailsluice functions", file=sys.stderr)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
