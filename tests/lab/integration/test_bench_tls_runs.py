"""``mailsluice bench relay``'s TLS variants, small real runs: smtp-source -> HELO/EHLO shim ->
mailsluice -> STARTTLS front -> smtp-sink, all on 127.0.0.1; the session log says whether
each handshake was made and resumed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from mailsluice_lab.bench import relay as relay_bench
from mailsluice_lab.processes import find_program

pytestmark = pytest.mark.integration

_NEEDED = ("smtp-source", "smtp-sink")


def _notes(database: Path) -> tuple[int, int]:
    """(handshakes, resumed ones) in a session log."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        rows = [line for (line,) in conn.execute("SELECT lines FROM transcript")]
    text = "\n".join(rows)
    return text.count("TLS established"), text.count("(session resumed)")


@pytest.mark.skipif(
    any(find_program(name) is None for name in _NEEDED), reason="needs smtp-source, smtp-sink"
)
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("name", "resumes"),
    [("mailsluice-tls-off", None), ("mailsluice-tls12", False), ("mailsluice-tls-resume", True)],
)
async def test_a_tls_variant_delivers_and_resumes_only_when_asked(
    tmp_path: Path, name: str, resumes: bool | None
) -> None:
    opts = relay_bench.parse_options(
        ["--via", name, "--messages", "40", "--sessions", "2", "--workers", "1",
         "--timeout", "90"]
    )  # fmt: skip
    result = await relay_bench.run_variant(opts, name, 0, tmp_path)
    assert result.status == "ok", result.note
    assert result.received == result.sent == 40
    handshakes, resumed = _notes(tmp_path / f"mailsluice-{name}-0.db")
    if resumes is None:
        assert handshakes == 0  # STARTTLS not offered
    else:
        assert handshakes == 40
        # the first sessions (one per parallel session at most) make the session
        assert resumed >= 38 if resumes else resumed == 0
