"""The bench scenarios' files: the CSV loaders and summaries, the Markdown report, the suite's
README, the PNG plots, all from synthetic data written to a temporary directory."""

from __future__ import annotations

import csv
import gzip
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.lab.bench_rows import T0, congestion_rows, fairness_rows

from mailsluice_lab.bench.scenarios import plots, report, stats, suite
from mailsluice_lab.bench.scenarios.stats import (
    DELIVERY_FIELDS,
    QUEUE_FIELDS,
    RESOURCE_FIELDS,
    Delivery,
)

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --- synthetic data ----------------------------------------------------------------------------


def _write(path: Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _deliveries_csv(path: Path, rows: Sequence[Delivery]) -> Path:
    return _write(path, DELIVERY_FIELDS, [
        (r.variant, r.scenario, r.tenant, r.mx, r.message_id, f"{r.sent_at:.6f}",
         f"{r.received_at:.6f}", f"{r.latency_s:.6f}") for r in rows
    ])  # fmt: skip


def _queues_csv(path: Path) -> Path:
    return _write(path, QUEUE_FIELDS, [("postfix", T0 + i, min(200, 20 * i), 5 * i, 3 * i)
                                       for i in range(40)])  # fmt: skip


def _resources_csv(path: Path) -> Path:
    rows = []
    for variant, disk in (("mailsluice", 1_000), ("postfix", 100_000)):
        for i in range(30):
            rows.append((variant, T0 + i / 2, 10 + i, 20_000 + 100 * i, 0, disk * i))
    rows.append(("postfix", T0 + 15.5, 5, 20_000, 0, 0))  # a counter reset (a process exited)
    rows.append(("postfix", T0 + 16.0, 5, 20_000, 0, 50_000))
    return _write(path, RESOURCE_FIELDS, rows)


# --- statistics --------------------------------------------------------------------------------


def test_summary_per_variant_mx_and_tenant_from_a_synthetic_csv(tmp_path: Path) -> None:
    rows = stats.read_deliveries(_deliveries_csv(tmp_path / "d.csv", congestion_rows()))
    assert len(rows) == 90
    summary = stats.summarize_deliveries(rows)
    assert list(summary) == ["mailsluice", "postfix"]
    ms = summary["mailsluice"]
    assert ms["count"] == 45
    mx1 = ms["by_mx"]["mx1"]
    assert mx1["count"] == 20
    assert mx1["first_received"] == pytest.approx(T0 + 0.1)
    assert mx1["last_received"] == pytest.approx(T0 + 19.1)
    assert mx1["completion_s"] == pytest.approx(19.1)
    assert mx1["latency_median_s"] == pytest.approx(0.1)
    assert mx1["throughput_msg_per_s"] == pytest.approx(20 / 19.1)
    assert ms["by_tenant"]["3"]["completion_s"] == pytest.approx(4 + 150)  # sent at 4, took 150
    assert summary["postfix"]["by_mx"]["mx2"]["latency_p95_s"] > 30  # 0.1 + 2k grows to 38.1


def test_queue_and_resource_summaries(tmp_path: Path) -> None:
    queues = stats.summarize_queues(stats.read_queues(_queues_csv(tmp_path / "q.csv")))
    assert queues["postfix"]["active_peak"] == 200
    assert queues["postfix"]["deferred_peak"] == 117
    res = stats.summarize_resources(stats.read_resources(_resources_csv(tmp_path / "r.csv")))
    assert res["mailsluice"]["write_bytes"] == 29_000
    assert res["mailsluice"]["cpu_percent_peak"] == 39
    # 29 steps of 100 kB, the reset to 0 is not negative, then +50 kB
    assert res["postfix"]["write_bytes"] == 2_900_000 + 50_000
    assert res["postfix"]["rss_kib_peak"] == 22_900


def test_loaders_name_the_file_and_the_problem(tmp_path: Path) -> None:
    missing = _write(tmp_path / "bad.csv", ("variant", "t"), [("postfix", "1")])
    with pytest.raises(ValueError, match=r"bad\.csv: missing column\(s\) active, incoming"):
        stats.read_queues(missing)
    garbled = _write(tmp_path / "nan.csv", QUEUE_FIELDS, [("postfix", "soon", 1, 2, 3)])
    with pytest.raises(ValueError, match=r"nan\.csv:2: column 't' is not a number"):
        stats.read_queues(garbled)
    # spaces after commas are accepted; an empty latency is received - sent
    spaced = tmp_path / "spaced.csv"
    spaced.write_text(", ".join(DELIVERY_FIELDS) + "\npostfix, fairness, 1, mx1, id, 10, 12.5, \n")
    [row] = stats.read_deliveries(spaced)
    assert (row.variant, row.tenant, row.latency_s) == ("postfix", "1", 2.5)


# --- report ------------------------------------------------------------------------------------


def _summary(scenario: str, rows: Sequence[Delivery], **kwargs: Any) -> dict[str, Any]:
    summary = stats.summarize_run(scenario, rows, **kwargs)
    summary["command"] = ["mailsluice", "bench", scenario, "--via", "all", "--out", "DIR"]
    summary["machine"] = {"nproc": 2, "mem_total": "4026532 kB", "kernel": "Linux 6.1.0",
                          "python": "3.11.2"}  # fmt: skip
    return summary


def test_congestion_report_table_rows_and_machine(tmp_path: Path) -> None:
    sent = {v: {"mx1": 20, "mx2": 20, "mx3": 100} for v in ("mailsluice", "postfix")}
    queues = stats.read_queues(_queues_csv(tmp_path / "q.csv"))
    summary = _summary("congestion", congestion_rows(), queues=queues, sent_by_mx=sent,
                       tarpit_mx="mx3")  # fmt: skip
    (tmp_path / "congestion_received.png").write_bytes(PNG_MAGIC)
    text = report.write_report(tmp_path, "congestion", summary).read_text()
    assert "| mailsluice | ok | 45 / 140 | 100.0 ms | 100.0 ms | 5 / 100 | 95 | - |" in text
    assert "| postfix | ok | 45 / 140 | 19.1 s |" in text
    assert "| 5 / 100 | 95 | 200 / 195 / 117 |" in text
    assert "healthy MX median relay latency: postfix / mailsluice = 191.00x" in text
    assert "| mailsluice | mx3 | 5 / 100 |" in text
    assert "`mailsluice bench congestion --via all --out DIR`" in text
    assert "2 cores, 3.8 GiB RAM, Linux 6.1.0, Python 3.11.2" in text
    assert "![congestion_received.png](congestion_received.png)" in text


def test_fairness_and_resources_report_rows(tmp_path: Path) -> None:
    summary = _summary("fairness", fairness_rows())
    text = report.render(tmp_path, "fairness", summary)
    assert "| mailsluice | ok | 30 | 20.0 s |" in text
    assert "| 2.00x | tenant 1: 10.0 s, tenant 2: 15.0 s, tenant 3: 20.0 s |" in text
    assert "| postfix | ok | 30 | 30.0 s | 1.000 | 1.00x |" in text
    resources = stats.read_resources(_resources_csv(tmp_path / "r.csv"))
    summary = _summary("resources", fairness_rows(), resources=resources)
    text = report.render(tmp_path, "resources", summary)
    expected = "| mailsluice | ok | 30 | 20.0 s | 1.5 | 39 % | 24 % | - | 22.4 MiB | - | 28.3 KiB |"
    assert expected in text
    assert "disk bytes written: postfix / mailsluice = 101.72x" in text
    summary["variants"]["mailsluice"]["resources"].update(cpu_seconds=4.5, private_kib_peak=2048)
    text = report.render(tmp_path, "resources", summary)
    assert "| 39 % | 24 % | 4.5 s | 22.4 MiB | 2.0 MiB | 28.3 KiB |" in text


def test_fairness_report_shows_the_spread_of_repeated_runs(tmp_path: Path) -> None:
    summary = _summary("fairness", fairness_rows())
    assert "Spread" not in report.render(tmp_path, "fairness", summary)
    summary["spread"] = {
        "mailsluice": {
            "jain_index": {"runs": 3, "min": 0.8, "median": 0.85, "max": 0.9},
            "slowest_fastest_ratio": {"runs": 3, "min": 1.5, "median": 2.0, "max": 3.1},
            "completion_s": {"runs": 3, "min": 20.0, "median": 25.0, "max": 31.0},
        },
        "postfix": {"jain_index": {"runs": 3, "min": 1.0, "median": 1.0, "max": 1.0}},
    }
    text = report.render(tmp_path, "fairness", summary)
    assert "### Spread over the repeated runs" in text
    assert (
        "| mailsluice | 3 | 0.800 / 0.850 / 0.900 | 1.50x / 2.00x / 3.10x | "
        "20.0 s / 25.0 s / 31.0 s |"
    ) in text
    assert "| postfix | 3 | 1.000 / 1.000 / 1.000 | - / - / - | - / - / - |" in text


def test_report_survives_a_sparse_summary(tmp_path: Path) -> None:
    out = tmp_path / "new"
    summary = {"variants": {"postfix": {"status": "skipped", "note": "postfix not installed"},
                            "mailsluice": None}}  # fmt: skip
    text = report.write_report(out, "congestion", summary).read_text()
    assert "| postfix | skipped: postfix not installed | - | - | - |" in text
    assert "| mailsluice | ok | - |" in text
    assert "command: `not recorded`" in text
    assert " cores, " in text  # this machine, gathered on the spot
    assert ", Python 3." in text
    assert "No variant was measured." in report.render(out, "relay", {})


# --- the suite's README ------------------------------------------------------------------------


def test_suite_readme_puts_the_headlines_side_by_side(tmp_path: Path) -> None:
    sent = {v: {"mx1": 20, "mx2": 20, "mx3": 100} for v in ("mailsluice", "postfix")}
    summaries = {
        "congestion": _summary("congestion", congestion_rows(), sent_by_mx=sent, tarpit_mx="mx3"),
        "fairness": _summary("fairness", fairness_rows()),
    }
    rows = suite.headline_rows(summaries)
    # columns: mailsluice, mailsluice-fcfs (not in these summaries), postfix, direct
    assert ["congestion", "healthy MX median relay latency", "100.0 ms", "-", "19.1 s", "-"] in rows
    assert ["fairness", "slowest / fastest tenant", "2.00x", "-", "1.00x", "-"] in rows
    assert not [row for row in rows if row[0] == "resources"]  # not run: no rows
    took, status = {"congestion": 500.0, "fairness": 100.0}, {"congestion": 0, "fairness": 1}
    text = suite.render_readme(summaries, took, "mailsluice bench suite --out X", status)
    assert "- total time: 600 s (10.0 min)" in text
    assert "| fairness | Jain's index | " in text
    assert "- [congestion](congestion/report.md): 500 s (8.3 min), ok;" in text
    assert "- [fairness](fairness/report.md): 100 s (1.7 min), exit status 1;" in text
    big, small = tmp_path / "deliveries.csv", tmp_path / "queues.csv"
    big.write_text("x" * 2000)
    small.write_text("y" * 10)
    assert suite.gzip_large(tmp_path, over=1000) == [tmp_path / "deliveries.csv.gz"]
    assert not big.exists()
    assert small.exists()
    assert gzip.decompress((tmp_path / "deliveries.csv.gz").read_bytes()) == b"x" * 2000


# --- plots -------------------------------------------------------------------------------------


def _assert_pngs(paths: Sequence[Path], names: Sequence[str]) -> None:
    assert [p.name for p in paths] == list(names)
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC), path
        assert len(data) > 5_000, path


def test_plots_write_png_files_from_synthetic_data(tmp_path: Path) -> None:
    deliveries = _deliveries_csv(tmp_path / "deliveries.csv", congestion_rows())
    queues = _queues_csv(tmp_path / "queues.csv")
    _assert_pngs(
        plots.plot_congestion(tmp_path / "c", deliveries, queues),
        ["congestion_received.png", "congestion_latency.png", "congestion_queues.png"],
    )
    _assert_pngs(plots.plot_congestion(tmp_path / "c2", deliveries, None),
                 ["congestion_received.png", "congestion_latency.png"])  # fmt: skip
    resources = _resources_csv(tmp_path / "resources.csv")
    _assert_pngs(plots.plot_resources(tmp_path / "r", resources, deliveries), ["resources.png"])
    fairness = _deliveries_csv(tmp_path / "fairness.csv", fairness_rows())
    _assert_pngs(plots.plot_fairness(tmp_path / "f", fairness), ["fairness.png"])


def test_congestion_received_is_a_share_of_what_was_sent(tmp_path: Path) -> None:
    deliveries = _deliveries_csv(tmp_path / "deliveries.csv", congestion_rows())
    sent = {v: {"mx1": 20, "mx2": 20, "mx3": 100} for v in ("mailsluice", "postfix")}
    [received, *_] = plots.plot_congestion(tmp_path, deliveries, None, sent=sent,
                                           mx_roles={"mx3": "tarpit"})  # fmt: skip
    assert received.name == "congestion_received.png"
    assert received.read_bytes().startswith(PNG_MAGIC)


def test_fairness_plot_lays_repeats_out_in_rows(tmp_path: Path) -> None:
    rows = fairness_rows()
    again = [Delivery(f"{r.variant}#2", r.scenario, r.tenant, r.mx, r.message_id + "b",
                      r.sent_at, r.received_at + 1, r.latency_s + 1) for r in rows]  # fmt: skip
    one = plots.plot_fairness(tmp_path / "one", _deliveries_csv(tmp_path / "1.csv", rows))
    two = plots.plot_fairness(tmp_path / "two", _deliveries_csv(tmp_path / "2.csv", rows + again))
    assert [p.name for p in two] == ["fairness.png"]
    # one row of panels for one run, two rows for two: the figure is twice as tall
    assert _png_size(two[0])[1] == 2 * _png_size(one[0])[1]
    assert _png_size(two[0])[0] == _png_size(one[0])[0]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_resource_plot_draws_private_memory_when_the_column_is_there(tmp_path: Path) -> None:
    plain = _resources_csv(tmp_path / "r.csv")
    richer = tmp_path / "r2.csv"
    lines = plain.read_text().splitlines()
    richer.write_text("\n".join([lines[0] + ",private_kib,processes",
                                 *(line + ",1000,3" for line in lines[1:])]) + "\n")  # fmt: skip
    samples = stats.read_resources(richer)
    assert {s.private_kib for s in samples} == {1000.0}
    assert {s.private_kib for s in stats.read_resources(plain)} == {None}
    deliveries = _deliveries_csv(tmp_path / "d.csv", fairness_rows())
    [png] = plots.plot_resources(tmp_path / "out", richer, deliveries)
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_plots_of_an_empty_run_write_nothing(tmp_path: Path) -> None:
    empty = _deliveries_csv(tmp_path / "deliveries.csv", [])
    assert plots.plot_congestion(tmp_path, empty, tmp_path / "absent.csv") == []
    assert plots.plot_fairness(tmp_path, empty) == []
    assert plots.plot_resources(tmp_path, tmp_path / "absent.csv", empty) == []
    assert not list(tmp_path.glob("*.png"))


def test_an_unfinished_run_is_plotted_as_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run cut off at 40 s whose tenant 3 got 4 of 10 (and tenant 4 nothing): their
    legend says so, not "done at ...", and the axis and their curves reach the cut-off
    (issue 23: the legend said "done at 5.0 s" and the axis stopped there)."""
    rows = [r for r in fairness_rows() if r.variant == "mailsluice"]
    rows = [r for r in rows if r.tenant != "3" or r.received_at <= T0 + 8.0]  # 4 of tenant 3
    figures: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    cuts = {"mailsluice": (40.0, {"1": 10, "2": 10, "3": 10, "4": 10})}
    plots.plot_fairness(tmp_path, _deliveries_csv(tmp_path / "d.csv", rows), cuts=cuts)
    [figure] = figures
    [ax] = [a for a in figure.axes if a.get_visible()]
    legend = ax.get_legend()
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == ["tenant 1: done at 10.0 s", "tenant 2: done at 15.0 s",
                      "tenant 3: 4/10 at the cut-off", "tenant 4: 0/10 at the cut-off"]  # fmt: skip
    assert legend.get_title().get_text() == "did not finish: cut off at 40 s"
    assert ax.get_xlim()[1] >= 40.0
    drawn = [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()]
    assert ([8.0, 40.0], [4, 4]) in drawn  # tenant 3 drawn on, flat, to the cut-off
    assert ([0.0, 40.0], [0, 0]) in drawn  # tenant 4, nothing at all
