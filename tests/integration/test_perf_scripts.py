"""The shell's micro benchmark (``mailsluice_lab.perf.session_shell_cost``) still drives the
runtime as it is: a few sessions through it, every one closed at the end (it asserts
that itself), so a change of the runtime cannot leave it broken unnoticed."""

from __future__ import annotations

import pytest

from mailsluice.runtime.session.mxleg import MxLeg
from mailsluice_lab.perf import session_shell_cost

pytestmark = pytest.mark.integration


async def test_the_shell_benchmark_runs_sessions_to_their_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(MxLeg, "connect", session_shell_cost.fake_connect)
    elapsed = await session_shell_cost.run(20)
    assert elapsed > 0
