"""The scenario benchmarks' files: CSV tails read as they grow, the tenants' submission
CSV, the queue CSVs the runs write."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.lab.bench_rows import variant_run

from mailsluice_lab.bench.scenarios.driver import msa_peaks, write_queues
from mailsluice_lab.bench.scenarios.runner import CsvTail, read_received, read_submitted

pytestmark = pytest.mark.integration


def test_csv_tail_returns_only_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    tail = CsvTail(path)
    assert tail.new_rows() == []  # no file yet
    path.write_text("mx,tenant,message_id,sent_at,received_at\nmx1,1,a,1.0,2.0\nmx1,1,b,1.")
    assert tail.new_rows() == [["mx1", "1", "a", "1.0", "2.0"]]
    with path.open("a") as handle:
        handle.write("5,3.0\n")
    assert tail.new_rows() == [["mx1", "1", "b", "1.5", "3.0"]]
    assert tail.new_rows() == []
    assert [r.message_id for r in read_received(path)] == ["a", "b"]


def test_read_submitted_counts_refusals(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("tenant,mx,message_id,sent_at,status\n1,mx1,a,1.0,ok\n"
                    "1,mx1,b,1.1,error: DATA: 451 try later\n")  # fmt: skip
    accepted, refused = read_submitted(path)
    assert [s.message_id for s in accepted] == ["a"]
    assert refused == 1


def test_write_queues_and_msa_peaks(tmp_path: Path) -> None:
    msa = (("t1", 0.0, 5, 0, 0), ("t1", 1.0, 2, 2, 7), ("t2", 0.0, 1, 0, 0))
    run = variant_run("postfix", queues=((0.0, 1, 2, 3),), msa_queues=msa)
    path = write_queues(tmp_path, {"postfix": run, "direct": variant_run("direct")})
    assert path is not None
    assert path.read_text().splitlines() == ["variant,t,active,incoming,deferred",
                                             "postfix,0.0,1,2,3"]  # fmt: skip
    assert (tmp_path / "msa_queues.csv").read_text().count("\n") == 4
    assert msa_peaks(run) == {"t1": 11, "t2": 1}
    assert write_queues(tmp_path / "none", {"direct": variant_run("direct")}) is None
