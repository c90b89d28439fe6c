"""Pure parts of the scenario benchmarks: the plan, the per-MX figures, message and CSV formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailsluice.benchmark.scenarios.measures import (
    Received,
    Submitted,
    first_arrivals,
    mx_figures,
    ratio,
    variant_figures,
)
from mailsluice.benchmark.scenarios.mx import MxSpec, bench_headers, specs_from_json, specs_to_json
from mailsluice.benchmark.scenarios.postfix import PostfixSpec, main_cf
from mailsluice.benchmark.scenarios.runner import CsvTail, read_received, read_submitted
from mailsluice.benchmark.scenarios.schedule import (
    Batch,
    Plan,
    congestion_plan,
    message_ids,
    rounds_plan,
)
from mailsluice.benchmark.scenarios.smtpclient import dot_stuff
from mailsluice.benchmark.scenarios.tenant import domain_of, make_message

pytestmark = pytest.mark.unit


# -- the plan --------------------------------------------------------------------------------


def test_congestion_plan_matches_the_study_shape() -> None:
    plan = congestion_plan(rounds=12, interval=5.0, a=5, ratio=100)
    assert plan.tenants() == (1, 2, 3)
    assert plan.per_mx() == {"mx1": 60, "mx2": 60, "mx3": 6000}
    assert plan.per_tenant() == {1: 60, 2: 60, 3: 6000}
    assert plan.total() == 6120
    assert plan.duration() == 55.0
    assert sorted({b.at for b in plan.batches}) == [5.0 * k for k in range(12)]
    assert {(b.tenant, b.mx) for b in plan.batches} == {(1, "mx1"), (2, "mx2"), (3, "mx3")}


def test_plan_for_one_tenant_and_json_round_trip() -> None:
    plan = congestion_plan(rounds=3, interval=2.5, a=2, ratio=10)
    mine = plan.for_tenant(3)
    assert [b.count for b in mine.batches] == [20, 20, 20]
    assert [b.at for b in mine.batches] == [0.0, 2.5, 5.0]
    assert Plan.from_json(plan.to_json()) == plan


def test_rounds_plan_skips_zero_counts_and_rejects_nonsense() -> None:
    plan = rounds_plan(rounds=2, interval=1, sends={1: ("mx1", 0), 2: ("mx2", 3)})
    assert plan.batches == (Batch(0.0, 2, "mx2", 3), Batch(1.0, 2, "mx2", 3))
    with pytest.raises(ValueError, match="rounds"):
        rounds_plan(rounds=0, interval=1, sends={1: ("mx1", 1)})
    with pytest.raises(ValueError, match="at least 1"):
        congestion_plan(rounds=1, interval=1, a=0, ratio=100)


@pytest.mark.parametrize("text", ['{"a": 1}', "[[0, 1, 2, 3]]", "[[0, 1, \"mx1\"]]",
                                  "[[-1, 1, \"mx1\", 3]]"])  # fmt: skip
def test_plan_from_json_refuses_malformed_entries(text: str) -> None:
    with pytest.raises(ValueError, match="plan"):
        Plan.from_json(text)


def test_message_ids_are_unique_across_batches() -> None:
    ids = message_ids(3, 0, 4) + message_ids(3, 1, 4) + message_ids(2, 0, 4)
    assert len(set(ids)) == 12
    assert ids[0] == "t3-0-0"
    assert ids[4] == "t3-1-0"


# -- figures -----------------------------------------------------------------------------------


def _sub(mid: str, mx: str, sent: float) -> Submitted:
    return Submitted(1, mx, mid, sent)


def _rcv(mid: str, mx: str, sent: float, received: float) -> Received:
    return Received(mx, 1, mid, sent, received)


def test_mx_figures_count_missing_repeats_and_latency() -> None:
    submitted = [_sub(f"m{i}", "mx1", 100.0 + i) for i in range(5)]
    received = [
        _rcv("m0", "mx1", 100.0, 101.0),
        _rcv("m1", "mx1", 101.0, 103.0),
        _rcv("m1", "mx1", 101.0, 109.0),  # a repeat: only the first arrival counts
        _rcv("m2", "mx1", 102.0, 105.0),
        _rcv("m4", "mx1", 104.0, 108.0),
        _rcv("stranger", "mx1", 100.0, 100.5),
    ]
    fig = mx_figures(submitted, received, started_at=100.0, injection_s=4.0)
    assert (fig["sent"], fig["received"], fig["missing"]) == (5, 4, 1)
    assert (fig["repeats"], fig["unexpected"]) == (1, 1)
    # latencies 1, 2, 3, 4
    assert fig["latency_median_s"] == 2.5
    assert fig["latency_p95_s"] == pytest.approx(3.85)
    assert fig["latency_max_s"] == 4.0
    assert fig["latency_early_median_s"] == 1.5  # sent at 100 and 101 (first quarter = 1 s)
    assert fig["latency_late_median_s"] == 4.0  # sent at 104 (last quarter)
    assert fig["completion_s"] == 8.0


def test_mx_figures_with_nothing_received() -> None:
    fig = mx_figures([_sub("a", "mx3", 1.0)], [], started_at=0.0, injection_s=10.0)
    assert fig["received"] == 0
    assert fig["missing"] == 1
    assert fig["latency_median_s"] is None
    assert fig["completion_s"] is None


def test_variant_figures_per_mx_and_groups() -> None:
    submitted = [_sub("a", "mx1", 0.0), _sub("b", "mx2", 0.0), _sub("c", "mx3", 0.0)]
    received = [_rcv("a", "mx1", 0.0, 1.0), _rcv("b", "mx2", 0.0, 3.0)]
    fig = variant_figures(submitted, received, started_at=0.0, injection_s=1.0,
                          groups={"healthy": ("mx1", "mx2")})  # fmt: skip
    assert set(fig["mx"]) == {"mx1", "mx2", "mx3"}
    assert fig["groups"]["healthy"]["received"] == 2
    assert fig["groups"]["healthy"]["latency_median_s"] == 2.0
    assert fig["total"]["missing"] == 1


def test_first_arrivals_orders_by_arrival() -> None:
    rows = [_rcv("x", "mx1", 0, 5), _rcv("y", "mx1", 0, 2), _rcv("x", "mx1", 0, 1)]
    first, repeats = first_arrivals(rows)
    assert [(r.message_id, r.received_at) for r in first] == [("x", 1), ("y", 2)]
    assert repeats == 1


def test_ratio() -> None:
    assert ratio(10.0, 4.0) == 2.5
    assert ratio(None, 1.0) is None
    assert ratio(1.0, 0.0) is None


# -- formats ------------------------------------------------------------------------------------


def test_message_carries_bench_headers_the_mx_reads_back() -> None:
    message = make_message(3, "mx3", "t3-4-17", 1234.5, 1024)
    head = message.split(b"\r\n\r\n", 1)[0]
    fields = bench_headers(head)
    assert fields == {"x-bench-id": "t3-4-17", "x-bench-tenant": "3",
                      "x-bench-sent": "1234.500000"}  # fmt: skip
    assert b"To: <user@mx3.msb.test>" in head
    assert 1024 - 80 <= len(message.split(b"\r\n\r\n", 1)[1]) <= 1024
    assert domain_of("mx1") == "mx1.msb.test"


def test_dot_stuffing() -> None:
    assert dot_stuff(b"a\r\n.b\r\n..c\n") == b"a\r\n..b\r\n...c\r\n.\r\n"
    assert dot_stuff(b"") == b".\r\n"


def test_mx_specs_round_trip_and_validation() -> None:
    specs = [MxSpec("mx1", "10.0.0.1"), MxSpec("mx3", "10.0.0.3", kind="tarpit", delay=0.5)]
    assert specs_from_json(specs_to_json(specs)) == specs
    with pytest.raises(ValueError, match="kind"):
        MxSpec("mx9", "10.0.0.9", kind="blackhole")
    with pytest.raises(ValueError, match="negative"):
        MxSpec("mx9", "10.0.0.9", kind="tarpit", delay=-1)


def test_postfix_main_cf_routes_by_transport_or_relayhost(tmp_path: Path) -> None:
    msa = main_cf(PostfixSpec(name="t1", root=tmp_path, listen="10.253.1.2",
                              mynetworks="10.253.0.0/16",
                              transport={"mx1.msb.test": "smtp:[10.253.200.11]:25"}))  # fmt: skip
    assert f"transport_maps = texthash:{tmp_path}/etc/transport\n" in msa
    assert "relayhost" not in msa
    assert "inet_interfaces = 10.253.1.2\n" in msa
    assert f"queue_directory = {tmp_path}/spool\n" in msa
    relay = main_cf(PostfixSpec(name="relay", root=tmp_path, listen="all", mynetworks="x",
                                relayhost="[10.253.1.1]:25",
                                settings={"qmgr_message_active_limit": "200"}))  # fmt: skip
    assert "relayhost = [10.253.1.1]:25\n" in relay
    assert "qmgr_message_active_limit = 200\n" in relay
    assert "transport_maps" not in relay


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
