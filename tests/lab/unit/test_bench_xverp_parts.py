"""``mailsluice bench xverp``'s pure parts: the list and its split over connections, the
personalised copies, the options, the summary (medians of the good runs) and the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailsluice_lab.bench import xverp_report
from mailsluice_lab.bench.xverp import parse_options

pytestmark = pytest.mark.unit


def test_the_list_is_split_round_robin_without_loss_or_empty_parts() -> None:
    members = xverp_report.recipients(10)
    assert len(set(members)) == 10
    assert members[0] == "member00001@example1.org"
    parts = xverp_report.split(members, 4)
    assert [len(p) for p in parts] == [3, 3, 2, 2]
    assert sorted(m for p in parts for m in p) == sorted(members)
    assert xverp_report.split(members[:2], 4) == [[members[0]], [members[1]]]
    assert xverp_report.split([], 3) == []


def test_the_post_and_its_personalised_copies() -> None:
    post = xverp_report.list_message(200)
    head, _, body = post.partition(b"\n\n")
    assert len(body) == 201
    assert b"Subject: this week" in head
    mine = xverp_report.personalised(post, "a@example.org")
    assert mine.startswith(head + b"\nTo-Member: <a@example.org>\n\nDear a@example.org,\n")
    assert mine.endswith(body)


def test_options_defaults_and_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    opts = parse_options([])
    assert (opts.recipients, opts.connections, opts.batch) == (1000, 4, 50)
    assert opts.via == ("mailsluice", "postfix")
    assert opts.modes == ("xverp", "personalised")
    assert parse_options(["--via", "direct", "--out", "x"]).out == Path("x")
    for bad in (["--via", "nginx"], ["--modes", "bulk"], ["--recipients", "0"], ["--size", "-1"]):
        with pytest.raises(SystemExit):
            parse_options(bad)
    assert "unknown forwarder" in capsys.readouterr().err


def _run(
    variant: str, mode: str, status: str, rate: float | None, note: str = ""
) -> dict[str, object]:
    return {
        "variant": variant, "mode": mode, "status": status, "note": note, "msg_per_s": rate,
        "rcpt_per_s": rate, "transactions": 10, "forwarder_cpu_seconds": 1.0,
        "client_cpu_seconds": 0.5,
    }  # fmt: skip


def test_the_summary_takes_medians_of_the_good_runs_and_the_table_shows_them() -> None:
    runs = [
        _run("mailsluice", "xverp", "ok", 100.0),
        _run("mailsluice", "personalised", "ok", 80.0),
        _run("mailsluice", "xverp", "ok", 300.0),
        _run("mailsluice", "xverp", "failed", None, "LOST: 3"),
        _run("mailsluice", "xverp", "ok", 200.0),
    ]
    summary = xverp_report.summarize(runs)
    assert [(c["variant"], c["mode"]) for c in summary] == [
        ("mailsluice", "xverp"), ("mailsluice", "personalised"),
    ]  # fmt: skip
    xverp = summary[0]
    assert (xverp["runs"], xverp["runs_ok"], xverp["msg_per_s_median"]) == (4, 3, 200.0)
    assert xverp["notes"] == ["LOST: 3"]
    params = {"recipients": 5, "connections": 2, "size": 10, "batch": 3, "repeat": 4}
    table = xverp_report.markdown(
        {"parameters": params, "summary": summary, "started_at": "2026-12-02T00:00:00+00:00"}
    )
    assert "| mailsluice | xverp | 3/4 | 200.0 (100, 300, 200) | 200.0 | 10 | 1.0 | 0.5 |" in table
    assert "* mailsluice / xverp: LOST: 3" in table
