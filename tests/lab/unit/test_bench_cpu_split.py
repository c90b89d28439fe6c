"""The relay benchmark's CPU split by process (issue 25), in memory: which process is
what, the CPU each role used between two samples, per message, and how the report shows
it (per variant and mode, with the ratios to nginx and to the Postfix relay)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from mailsluice_lab.bench import cpusplit
from mailsluice_lab.bench.cpusplit import ProcSample
from mailsluice_lab.bench.report import build_report, format_table

pytestmark = pytest.mark.unit

PY = "/usr/bin/python3 -m mailsluice serve --listen 127.0.0.1:2525"
LOG = "/usr/bin/python3 -m mailsluice.sessionlog.child"


def proc(pid: int, ppid: int, cmdline: str = PY, started: int = 0, **ticks: int) -> ProcSample:
    return ProcSample(
        pid=pid, ppid=ppid, name="python3", cmdline=cmdline, started=started,
        utime=ticks.get("u", 0), stime=ticks.get("s", 0), cutime=ticks.get("cu", 0),
        cstime=ticks.get("cs", 0), peak_rss_kib=ticks.get("rss"),
    )  # fmt: skip


def test_one_worker_and_its_log_writer() -> None:
    samples = [proc(10, 1), proc(11, 10, LOG)]
    assert cpusplit.roles(samples, 10, mailsluice=True) == {10: "worker", 11: "log-writer"}


def test_the_tls_pair_maker_is_neither_a_worker_nor_makes_the_root_a_supervisor() -> None:
    maker = "/usr/bin/python3 -c from mailsluice.runtime.tls.client import make_pair_child"
    samples = [proc(10, 1), proc(11, 10, LOG), proc(12, 10, maker)]
    assert cpusplit.roles(samples, 10, mailsluice=True) == {
        10: "worker", 11: "log-writer", 12: "tls-pair"
    }  # fmt: skip


def test_workers_under_a_supervisor_with_the_broker_started_first() -> None:
    samples = [
        proc(10, 1),
        proc(12, 10, started=5),  # a worker
        proc(11, 10, started=4),  # the broker: started first, one more than --workers
        proc(13, 10, started=6),
        proc(14, 12, LOG), proc(15, 13, LOG),
    ]  # fmt: skip
    assert cpusplit.roles(samples, 10, mailsluice=True, workers=2) == {
        10: "supervisor", 11: "broker", 12: "worker", 13: "worker",
        14: "log-writer", 15: "log-writer",
    }  # fmt: skip
    # without fair sharing there is no broker: as many children as workers
    assert cpusplit.roles(samples[:2] + samples[3:4], 10, mailsluice=True, workers=2) == {
        10: "supervisor", 12: "worker", 13: "worker",
    }  # fmt: skip


def test_other_programs_are_named_by_their_comm() -> None:
    samples = [replace(proc(10, 1), name="nginx"), replace(proc(11, 10), name="nginx")]
    assert cpusplit.roles(samples, 10, mailsluice=False) == {10: "nginx", 11: "nginx"}


def test_cpu_between_samples_by_role_user_and_system_apart() -> None:
    before = {10: proc(10, 1, u=100, s=50), 11: proc(11, 10, LOG, u=10, s=1)}
    after = {
        10: proc(10, 1, u=300, s=90, cu=5, cs=1),  # a reaped child counts for its parent
        11: proc(11, 10, LOG, u=60, s=11),
        12: proc(12, 10, LOG, started=9, u=7, s=3),  # new during the run: from zero
    }
    role_of = cpusplit.roles([*before.values(), *after.values()], 10, mailsluice=True)
    split = cpusplit.cpu_split(before, after, role_of, clk_tck=100)
    assert split == {
        "log-writer": {"user": 0.57, "system": 0.13},
        "worker": {"user": 2.05, "system": 0.41},
    }
    per = cpusplit.per_message_ms(split, messages=1000)
    assert per["worker"] == {"user": 2.05, "system": 0.41, "total": 2.46}
    assert per["all"] == {"user": 2.62, "system": 0.54, "total": 3.16}
    assert cpusplit.per_message_ms(split, messages=0) == {}


def test_a_reused_pid_is_a_new_process() -> None:
    before = {10: proc(10, 1, started=1, u=500)}
    after = {10: proc(10, 1, started=2, u=20)}
    assert cpusplit.cpu_split(before, after, {10: "worker"}, 100)["worker"]["user"] == 0.2


def test_peak_rss_is_the_largest_process_of_each_role() -> None:
    after = {1: proc(1, 0, rss=50_000), 2: proc(2, 1, LOG, rss=20_000),
             3: proc(3, 1, LOG, rss=22_000), 4: proc(4, 1)}  # fmt: skip
    role_of = {1: "worker", 2: "log-writer", 3: "log-writer", 4: "worker"}
    assert cpusplit.rss_split(after, role_of) == {"log-writer": 22_000, "worker": 50_000}
    now = {1: replace(after[1], rss_kib=30_000), 2: replace(after[2], rss_kib=12_000)}
    assert cpusplit.rss_split(now, role_of, peak=False) == {"log-writer": 12_000, "worker": 30_000}


def test_sampling_this_process() -> None:
    import os

    me = cpusplit.sample(os.getpid())
    assert me is not None
    assert me.pid == os.getpid()
    assert me.ppid == os.getppid()
    assert me.rss_kib
    assert me.peak_rss_kib
    assert me.utime >= 0
    assert "python" in me.cmdline.lower()
    assert cpusplit.sample(2**22 + 1) is None  # above pid_max: never a process


def _run(variant: str, rate: float, *, many: bool = False, worker: float = 0.5) -> dict[str, Any]:
    label = f"{variant} -d" if many else variant
    if not variant.startswith("mailsluice"):  # its processes by name
        split = {"all": {"user": 0.1, "system": 0.1, "total": 0.2}}
        split[variant] = split["all"]
        return {"variant": variant, "label": label, "repeat": 0, "status": "ok", "note": "",
                "msg_per_s": rate, "cpu_seconds": 0.2, "peak_rss_kib": 10_240, "uvloop": None,
                "received": 1000, "cpu_ms_per_message": split}  # fmt: skip
    return {
        "variant": variant, "label": label, "repeat": 0, "status": "ok", "note": "",
        "msg_per_s": rate, "cpu_seconds": 1.0, "peak_rss_kib": 40_960, "uvloop": None,
        "received": 1000, "machine_cpu": {"busy_pct": 80.0, "steal_pct": 0.0},
        "cpu_ms_per_message": {
            "worker": {"user": worker * 0.8, "system": worker * 0.2, "total": worker},
            "log-writer": {"user": 0.1, "system": 0.0, "total": 0.1},
            "all": {"user": worker * 0.8 + 0.1, "system": worker * 0.2, "total": worker + 0.1},
        },
        "peak_rss_kib_by_role": {"worker": 40_960, "log-writer": 20_480},
        "start_rss_kib_by_role": {"worker": 30_720},
    }  # fmt: skip


def _report(runs: list[dict[str, Any]], via: tuple[str, ...]) -> dict[str, object]:
    params = {
        "messages": 1000, "size": 1024, "sessions": 20, "repeat": 3,
        "nginx_worker_processes": "1", "connection_per_message": True, "both_modes": True,
    }  # fmt: skip
    return build_report(via=via, parameters=params, machine={}, started_at="t", runs=runs)


def test_the_report_per_variant_and_mode_with_both_ratios_and_the_split() -> None:
    via = ("mailsluice-transparent", "nginx", "postfix")
    runs = [
        _run("mailsluice-transparent", 2000, worker=0.4),
        _run("mailsluice-transparent", 2400, worker=0.5),
        _run("mailsluice-transparent", 2200, worker=0.6),
        _run("nginx", 4000), _run("postfix", 500),
        _run("mailsluice-transparent", 3000, many=True), _run("nginx", 10_000, many=True),
        _run("postfix", 1000, many=True),
    ]  # fmt: skip
    report = _report(runs, via)
    summary: Any = report["summary"]
    mine = summary["mailsluice-transparent"]
    assert mine["msg_per_s_median"] == 2200
    assert mine["runs"] == 3
    assert (mine["msg_per_s_min"], mine["msg_per_s_max"]) == (2000, 2400)
    assert mine["cpu_ms_per_message"]["worker"] == {
        "user": 0.4, "system": 0.1, "total": 0.5, "min": 0.4, "max": 0.6,
    }  # fmt: skip
    assert mine["peak_rss_kib_by_role"] == {"log-writer": 20_480, "worker": 40_960}
    assert summary["mailsluice-transparent -d"]["msg_per_s_median"] == 3000
    ratios: Any = report["ratios"]
    assert ratios["mailsluice-transparent_vs_nginx"] == {"value": 0.55, "goal": 0.5, "met": True}
    assert ratios["mailsluice-transparent_vs_postfix"]["value"] == 4.4
    assert ratios["mailsluice-transparent -d_vs_nginx -d"]["value"] == 0.3  # within a mode
    assert ratios["mailsluice-transparent -d_vs_postfix -d"]["value"] == 3.0
    table = format_table(report)
    row = next(line for line in table.splitlines() if line.startswith("mailsluice-transparent "))
    assert "2,200" in row
    assert "2,000-2,400" in row
    assert "0.55x" in row
    assert "4.40x" in row
    assert "0.600" in row
    assert "80%" in row
    d_row = next(line for line in table.splitlines() if line.startswith("nginx -d"))
    assert "1.00x" in d_row
    assert "10.00x" in d_row
    assert (
        "  mailsluice-transparent CPU ms/msg: worker 0.500 (0.400 user + 0.100 sys; "
        "0.400-0.600) 40.0 MiB (at start 30.0), log-writer 0.100 (0.100 user + 0.000 sys; "
        "0.100-0.100) 20.0 MiB, all 0.600" in table
    )
    assert "mailsluice-transparent / nginx: 0.55x (goal >= 0.5x: met)" in table
    assert "mailsluice-transparent -d / nginx -d: 0.30x (goal >= 0.5x: NOT met)" in table
    assert "nginx CPU ms/msg" not in table  # not mailsluice: by name in relay.json only


def test_a_report_of_one_mode_has_no_d_rows() -> None:
    report = _report([_run("mailsluice", 1000), _run("nginx", 2000)], ("mailsluice", "nginx"))
    assert "mailsluice -d" not in report["summary"]  # type: ignore[operator]
    ratios: Any = report["ratios"]
    assert not any(key.endswith(" -d") for key in ratios)
    assert "mailsluice / nginx: 0.50x (goal >= 0.5x: met)" in format_table(report)
