"""The fuzz targets (``fuzz/fuzz_*.py``) as unit tests: seeds, random inputs, and teeth.

Runs without atheris: each target's ``test_one_input`` is replayed over its seed corpus
and over a few hundred random and mutated inputs (fixed seeds, so a failure reproduces).
A target that cannot fail would prove nothing, so each one is also shown to catch a
deliberately broken implementation. Known bugs found by fuzzing are kept as inputs in
``fuzz/crashes/<target>/<bug-id>.<n>`` (described in ``fuzz/crashes/README.md``): they are
strict xfails here (when the bug is fixed, the test says so: move the input to the seed
corpus), and the random inputs skip those bugs' invariants so they still guard the rest.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from mailsluice import native
from mailsluice.relay import body as relay_body
from mailsluice.smtp import replies
from mailsluice.smtp.commands import Command
from mailsluice.smtp.data import BodyChunk, BodyScanner
from mailsluice.smtp.lines import Line, LineFramer, LineTooLong
from mailsluice.smtp.replies import Reply, ReplyAssembler

pytestmark = pytest.mark.unit

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
TARGETS = ("lines", "commands", "replies", "data", "ehlo", "relay")
RANDOM_INPUTS = 300
CRASHES = sorted((FUZZ / "crashes").glob("*/*.*"))
KNOWN_BUGS = sorted({path.name.split(".")[0] for path in CRASHES})


def target(name: str) -> ModuleType:
    return importlib.import_module(f"fuzz.fuzz_{name}")


def seeds(name: str) -> list[bytes]:
    return [path.read_bytes() for path in sorted((FUZZ / "corpus" / name).iterdir())]


def mutate(rng: random.Random, data: bytes) -> bytes:
    """A few libFuzzer-like edits: flip, insert, erase, duplicate a slice."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        at = rng.randint(0, len(buf))
        kind = rng.randrange(4)
        if kind == 0 and at < len(buf):
            buf[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        elif kind == 2:
            del buf[at : at + rng.randint(1, 8)]
        else:
            buf[at:at] = buf[at : at + rng.randint(1, 16)]
    return bytes(buf)


@pytest.mark.parametrize("name", TARGETS)
def test_seed_corpus_holds_the_invariants(name: str) -> None:
    corpus = seeds(name)
    assert len(corpus) >= 4, f"fuzz/corpus/{name} needs seeds (python -m fuzz.make_corpus)"
    for data in corpus:
        target(name).test_one_input(data)


@pytest.mark.parametrize("name", TARGETS)
def test_random_and_mutated_inputs_hold_the_invariants(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAILSLUICE_FUZZ_SUPPRESS", ",".join(KNOWN_BUGS))
    rng = random.Random(f"fuzz-{name}")
    corpus = seeds(name)
    run: Callable[[bytes], None] = target(name).test_one_input
    for _ in range(RANDOM_INPUTS):
        if rng.random() < 0.3:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
        else:
            data = mutate(rng, rng.choice(corpus))
        try:
            run(data)
        except AssertionError as exc:
            raise AssertionError(f"fuzz_{name} input {data!r}: {exc}") from exc


@pytest.mark.parametrize("path", CRASHES, ids=[f"{p.parent.name}/{p.name}" for p in CRASHES])
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="known bug, fuzz/crashes/README.md")
def test_known_crash_still_fails(path: Path) -> None:
    target(path.parent.name).test_one_input(path.read_bytes())


# ------------------------------------------------------------------ the targets have teeth
class _FramerWithoutCr(LineFramer):
    """Broken on purpose: says every line ended with CRLF."""

    def next_line(self) -> Line | LineTooLong | None:
        item = super().next_line()
        return Line(item.content, bare_lf=False) if isinstance(item, Line) else item


class _AssemblerIgnoringBareLf(ReplyAssembler):
    """Broken on purpose: accepts reply lines that ended with a bare LF."""

    def add_line(self, content: bytes, bare_lf: bool = False) -> Reply | None:
        return super().add_line(content, False)


class _LenientScanner(BodyScanner):
    """Broken on purpose: takes ``LF . LF`` for end-of-data (SMTP smuggling)."""

    def feed(self, data: bytes) -> BodyChunk:
        return super().feed(data.replace(b"\n.\n", b"\r\n.\r\n"))


# The teeth below swap a class or function of the core for a broken one. Compiled by mypyc,
# the core calls its own code directly (and its classes cannot be subclassed): a swap
# reaches nothing. They run in the pure pass of scripts/test (MAILSLUICE_PURE=1).
pure_only = pytest.mark.skipif(
    native.build() == "compiled", reason="swaps core code: shown in the pure build's pass"
)


@pure_only
def test_lines_target_catches_a_framer_that_loses_the_bare_lf(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(target("lines"), "LineFramer", _FramerWithoutCr)
    with pytest.raises(AssertionError):
        target("lines").test_one_input(b"\x20\x00\x01abc\ndef\r\n")


def test_commands_target_catches_a_parser_that_passes_control_characters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        target("commands"), "parse_command", lambda line: Command("NOOP", line, b"")
    )
    with pytest.raises(AssertionError, match="control character"):
        target("commands").test_one_input(b"NOOP\rMAIL FROM:<evil@example.com>")


@pure_only
def test_replies_target_catches_an_assembler_that_accepts_bare_lf(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(target("replies"), "ReplyAssembler", _AssemblerIgnoringBareLf)
    with pytest.raises(AssertionError, match="garbled line accepted"):
        target("replies").test_one_input(b"\x01250 ok\n")


@pure_only
def test_data_target_catches_a_scanner_fooled_by_smuggling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(target("data"), "BodyScanner", _LenientScanner)
    with pytest.raises(AssertionError, match=r"end-of-data|forwarded is not the input"):
        target("data").test_one_input(b"\x00\x00\x00\x04hi\n.\nMAIL FROM:<e@x>\r\n.\r\n")


def test_ehlo_target_catches_an_unedited_capability_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(target("ehlo"), "edit_for_client", lambda reply, limit: reply)
    with pytest.raises(AssertionError, match="STARTTLS passed to the client"):
        target("ehlo").test_one_input(b"\x00\x00mx.example\nPIPELINING\nSTARTTLS")


@pure_only
def test_relay_target_catches_a_2xx_the_mx_never_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replies, "timeout_after_dot", lambda host: Reply.make(250, "2.0.0", "Ok"))
    with pytest.raises(AssertionError, match="2xx to end-of-data the MX did not give"):
        target("relay").test_one_input((FUZZ / "corpus/relay/timeout-after-dot").read_bytes())


@pure_only
def test_relay_target_catches_a_smuggled_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_body, "BodyScanner", _LenientScanner)
    with pytest.raises(AssertionError, match=r"2xx for another message|never sent"):
        target("relay").test_one_input((FUZZ / "corpus/relay/smuggling-lf-dot").read_bytes())
