"""``mailsluice serve --workers 2`` with ``admin_listen``: one scrape sees the whole host.

Eight client addresses (the kernel steers each to one worker) send two messages each;
the scrape, served by the broker's process, sums both workers' deliveries, says both
are up, and shows the destination from the broker's scheduler. A worker killed is
restarted: its deliveries stay counted, the restart is counted, and both are up again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import smtplib
import time
from pathlib import Path

import pytest
from tests.integration.test_metrics import TOKEN, _get, samples, value
from tests.integration.test_serve_workers import _serve, _wait_for_workers

from mailsluice.sessionlog.reader import list_sessions
from mailsluice_lab.peers.mx import ScriptedMX
from mailsluice_lab.processes import free_port

pytestmark = pytest.mark.integration


def _send_from(source: str, port: int, count: int) -> None:
    for n in range(count):
        with smtplib.SMTP("127.0.0.1", port, timeout=30, source_address=(source, 0)) as smtp:
            smtp.sendmail(f"s{n}@{source}", [f"r{n}@example.org"], f"Subject: {n}\r\n\r\nbody\r\n")


def _scrape_until(port: int, done: object, timeout: float = 10.0) -> dict:  # type: ignore[type-arg]
    """Scrape until ``done(samples)`` (the workers' values are sampled every second)."""
    deadline = time.monotonic() + timeout
    while True:
        status, text = _get(port, "/metrics", TOKEN)
        assert status == 200, text
        got = samples(text)
        if done(got) or time.monotonic() > deadline:  # type: ignore[operator]
            return got
        time.sleep(0.2)


def _metric_dirs(state: Path) -> list[Path]:
    return list(state.glob("metrics-*"))


def _live_workers(state: Path) -> set[int]:
    """The pids with live gauges in the run's metrics directory: the workers."""
    (directory,) = _metric_dirs(state)
    return {int(p.stem.rsplit("_", 1)[1]) for p in directory.glob("gauge_livesum_*")}


@pytest.mark.parametrize("fair", [True, False], ids=["broker", "alone"])
async def test_one_scrape_sums_both_workers(tmp_path: Path, fair: bool) -> None:
    log = tmp_path / "sessions.db"
    token = tmp_path / "admin.token"
    token.write_text(TOKEN)
    admin = free_port()
    config = tmp_path / "mailsluice.toml"
    config.write_text(
        f'admin_listen = "127.0.0.1:{admin}"\nadmin_token_file = "{token}"\n'
        + ("" if fair else "[fair_sharing]\nenabled = false\n")
    )
    sources = [f"127.0.0.{n}" for n in range(2, 10)]
    async with ScriptedMX() as mx:
        port = free_port()
        proc = _serve(
            "--config", str(config), "--workers", "2", "--listen", f"127.0.0.1:{port}",
            "--upstream", f"{mx.host}:{mx.port}", "--log", f"sqlite:{log}",
        )  # fmt: skip
        started = ""
        try:
            started = await asyncio.wait_for(asyncio.to_thread(_wait_for_workers, proc, 2), 20)
            listening = time.monotonic()
            async with asyncio.TaskGroup() as group:
                for source in sources:
                    group.create_task(asyncio.to_thread(_send_from, source, port, 2))
            await mx.ledger.wait_for(16, timeout=10)

            def delivered(got: dict) -> bool:  # type: ignore[type-arg]
                return value(got, "mailsluice_transactions_total", outcome="delivered") == 16

            def ended(got: dict) -> bool:  # type: ignore[type-arg]
                # a session is counted when it closes, a moment after its transaction
                return delivered(got) and value(
                    got, "mailsluice_sessions_total", result="quit"
                ) == 16  # fmt: skip

            got = await asyncio.to_thread(_scrape_until, admin, ended)
            assert ended(got), got
            assert value(got, "mailsluice_workers_up") == 2
            assert (await asyncio.to_thread(_get, admin, "/readyz", TOKEN))[0] == 200
            assert (await asyncio.to_thread(_get, admin, "/metrics", None))[0] == 401
            if not fair:
                return
            # the destination, from the broker's scheduler (its idle connections)
            assert "mailsluice_destination_connection_limit" in {k[0] for k in got}
            # a worker killed: restarted, counted; what it counted stays (a worker that
            # dies in its first 5 s is a failure at start, which stops everything)
            await asyncio.sleep(max(0.0, listening + 5.2 - time.monotonic()))
            workers = _live_workers(tmp_path)
            assert len(workers) == 2
            os.kill(min(workers), signal.SIGKILL)

            def restarted(got: dict) -> bool:  # type: ignore[type-arg]
                return (
                    value(got, "mailsluice_worker_restarts_total") == 1
                    and value(got, "mailsluice_workers_up") == 2
                )

            got = await asyncio.to_thread(_scrape_until, admin, restarted)
            assert restarted(got), got
            assert delivered(got)
        finally:
            proc.send_signal(signal.SIGTERM)
            output = started + (await asyncio.to_thread(proc.communicate, None, 30))[0].decode()
        assert proc.returncode == 0, output
        assert ("exited with -9; restarting it" in output) is fair, output
    assert not _metric_dirs(tmp_path), "the metrics directory is removed at exit"
    sessions = list_sessions(f"sqlite:{log}", 0)
    assert sum(s["messages"] for s in sessions) == 16
    assert len({s["id"].split("-")[0] for s in sessions}) == 2  # both workers had some
