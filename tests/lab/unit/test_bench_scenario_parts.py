"""Pure parts of the scenario benchmarks: the plan, the per-MX figures, message and CSV formats."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from tests.lab.bench_rows import variant_run

from mailsluice_lab.bench.scenarios import driver
from mailsluice_lab.bench.scenarios.driver import (
    delivery_rows,
    exit_status,
    labelled,
)
from mailsluice_lab.bench.scenarios.fairness import from_release, spread, spreads, t0
from mailsluice_lab.bench.scenarios.fairness import parse_args as fairness_args
from mailsluice_lab.bench.scenarios.measures import (
    Received,
    Submitted,
    first_arrivals,
    mx_figures,
    ratio,
    variant_figures,
)
from mailsluice_lab.bench.scenarios.msa import Envelope, SimMSA
from mailsluice_lab.bench.scenarios.postfix import HOLD_ALL, PostfixSpec, main_cf
from mailsluice_lab.bench.scenarios.procstat import (
    CLK_TCK,
    cpu_percent,
    descendants,
    parse_keyed,
    parse_stat,
    parse_statm,
)
from mailsluice_lab.bench.scenarios.resources import cpu_seconds, parse_bursts
from mailsluice_lab.bench.scenarios.resources import parse_args as resources_args
from mailsluice_lab.bench.scenarios.runner import scenario_mx
from mailsluice_lab.bench.scenarios.schedule import (
    Batch,
    Plan,
    bursts_plan,
    congestion_plan,
    fairness_plan,
    message_ids,
    rounds_plan,
)
from mailsluice_lab.bench.scenarios.stats import Delivery, ordered_variants, split_label
from mailsluice_lab.bench.scenarios.tenant import domain_of, make_message
from mailsluice_lab.peers.recorders import bench_headers
from mailsluice_lab.peers.run_mx import MxSpec, specs_from_json, specs_to_json
from mailsluice_lab.peers.sender import dot_stuff

pytestmark = pytest.mark.unit

POSTFIX_ROOT = Path("/srv/msb-test")  # only written into configurations here


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
    specs = [
        MxSpec("mx1", "10.0.0.1"),
        MxSpec("mx3", "10.0.0.3", reply_delay=0.5, reject=("a@b",), record="maildir"),
        scenario_mx("mx2", connection_limit=10),
    ]
    assert specs_from_json(specs_to_json(specs)) == specs
    assert [spec.kind for spec in specs] == ["sink", "tarpit", "limited"]
    assert specs[2].hostname == "mx2.msb.test"
    with pytest.raises(ValueError, match="record"):
        MxSpec("mx9", "10.0.0.9", record="blackhole")
    with pytest.raises(ValueError, match="negative"):
        MxSpec("mx9", "10.0.0.9", reply_delay=-1)


def test_postfix_main_cf_routes_by_transport_or_relayhost() -> None:
    msa = main_cf(PostfixSpec(name="t1", root=POSTFIX_ROOT, listen="10.253.1.2",
                              mynetworks="10.253.0.0/16",
                              transport={"mx1.msb.test": "smtp:[10.253.200.11]:25"}))  # fmt: skip
    assert f"transport_maps = texthash:{POSTFIX_ROOT}/etc/transport\n" in msa
    assert "relayhost" not in msa
    assert "inet_interfaces = 10.253.1.2\n" in msa
    assert f"queue_directory = {POSTFIX_ROOT}/spool\n" in msa
    relay = main_cf(PostfixSpec(name="relay", root=POSTFIX_ROOT, listen="all", mynetworks="x",
                                relayhost="[10.253.1.1]:25",
                                settings={"qmgr_message_active_limit": "200"}))  # fmt: skip
    assert "relayhost = [10.253.1.1]:25\n" in relay
    assert "qmgr_message_active_limit = 200\n" in relay
    assert "transport_maps" not in relay


# -- the fairness and resources loads -----------------------------------------------------------


def test_fairness_plan_every_tenant_sends_n_to_one_mx_at_once() -> None:
    plan = fairness_plan(messages=1000)
    assert plan.per_tenant() == {1: 1000, 2: 1000, 3: 1000}
    assert plan.per_mx() == {"mx1": 3000}
    assert plan.duration() == 0.0
    assert fairness_plan(messages=5, tenants=2, mx="mx9").per_mx() == {"mx9": 10}
    with pytest.raises(ValueError, match="at least 1"):
        fairness_plan(messages=0)


def test_bursts_plan_grows_and_sends_each_tenant_to_its_own_mx() -> None:
    plan = bursts_plan(bursts=(100, 300, 1000), interval=10.0)
    assert plan.per_tenant() == {1: 1400, 2: 1400, 3: 1400}
    assert plan.per_mx() == {"mx1": 1400, "mx2": 1400, "mx3": 1400}
    assert [(b.at, b.count) for b in plan.for_tenant(2).batches] == [
        (0.0, 100), (10.0, 300), (20.0, 1000)
    ]  # fmt: skip
    assert {b.mx for b in plan.for_tenant(3).batches} == {"mx3"}
    for bad in ((), (100, 0)):
        with pytest.raises(ValueError, match="bursts"):
            bursts_plan(bursts=bad, interval=1)


def test_parse_bursts_and_cpu_seconds() -> None:
    assert parse_bursts("100,300,1000") == (100, 300, 1000)
    for bad in ("", "100,,3", "1e3", "5,-1"):
        with pytest.raises(ValueError, match="--bursts"):
            parse_bursts(bad)
    # 50 % for 2 s, then 100 % for 1 s: 2 CPU seconds (the first sample has no interval)
    rows = [(10.0, 0.0, 1, 0, 0, 1, 1), (12.0, 50.0, 1, 0, 0, 1, 1), (13.0, 100.0, 1, 0, 0, 1, 1)]
    assert cpu_seconds(rows) == pytest.approx(2.0)
    assert cpu_seconds(rows[:1]) == 0.0


def test_spread_of_a_figure_over_runs() -> None:
    assert spread([0.9, None, 0.7, 0.8]) == {"runs": 3, "min": 0.7, "median": 0.8, "max": 0.9,
                                             "max_over_min": 1.286}  # fmt: skip
    assert spread([2.0, 4.0])["median"] == 3.0
    assert spread([None])["runs"] == 0
    grouped = spreads({
        "mailsluice": {"fairness": {"jain_index": 0.8, "completion_s": 30.0}},
        "mailsluice#2": {"fairness": {"jain_index": 0.9, "completion_s": 20.0}},
        "postfix": {"fairness": {"jain_index": 1.0}},
    })  # fmt: skip
    assert grouped["mailsluice"]["jain_index"]["runs"] == 2
    assert grouped["mailsluice"]["completion_s"]["max"] == 30.0
    assert grouped["postfix"]["completion_s"]["runs"] == 0


def test_fairness_clock_starts_at_the_release() -> None:
    rows = [Delivery("postfix", "fairness", "1", "mx1", "a", 90.0, 103.0, 13.0),
            Delivery("postfix", "fairness", "1", "mx1", "b", 101.0, 104.0, 3.0),
            Delivery("direct", "fairness", "1", "mx1", "c", 90.0, 95.0, 5.0)]  # fmt: skip
    moved = from_release(rows, "postfix", 100.0)
    assert [(d.message_id, d.sent_at, d.latency_s) for d in moved] == [
        ("a", 100.0, 3.0), ("b", 101.0, 3.0)
    ]  # fmt: skip
    assert t0(variant_run("postfix", released_at=100.0)) == 100.0
    assert t0(variant_run("postfix")) == 100.0  # not held: the first batch (started_at)
    assert t0(variant_run("postfix", started_at=50.0)) == 50.0


def test_run_labels_and_split_label() -> None:
    runs = [
        variant_run("mailsluice"),
        variant_run("postfix"),
        variant_run("mailsluice"),
        variant_run("mailsluice"),
    ]
    assert list(labelled(runs)) == ["mailsluice", "postfix", "mailsluice#2", "mailsluice#3"]
    assert split_label("postfix#2") == ("postfix", 2)
    assert split_label("postfix") == ("postfix", 1)
    assert split_label("odd#name#x") == ("odd#name#x", 1)
    assert ordered_variants(["direct", "mailsluice#2", "postfix", "mailsluice", "zeta"]) == [
        "mailsluice", "mailsluice#2", "postfix", "direct", "zeta"
    ]  # fmt: skip


def test_delivery_rows_keep_first_arrivals_and_exit_status() -> None:
    received = (Received("mx1", 2, "b", 100.0, 103.0), Received("mx1", 1, "a", 100.0, 101.5),
                Received("mx1", 1, "a", 100.0, 109.0))  # fmt: skip
    rows = delivery_rows("fairness", "postfix#2", variant_run("postfix", received=received))
    assert rows == [
        ("postfix#2", "fairness", 1, "mx1", "a", "100.000000", "101.500000", "1.500000"),
        ("postfix#2", "fairness", 2, "mx1", "b", "100.000000", "103.000000", "3.000000"),
    ]
    assert exit_status(None) == 130
    assert exit_status([]) == 1
    assert exit_status([variant_run("postfix"), variant_run("direct", status="incomplete")]) == 1
    assert exit_status([variant_run("postfix")]) == 0


def test_common_options_resolve_variants_and_refuse_nonsense(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = driver.parser("fairness", "test")
    args = driver.parse(parser, ["--via", "postfix, direct", "--out", "x"])
    assert isinstance(args, argparse.Namespace)
    assert args.variants == ("postfix", "direct")
    assert args.argv == ["--via", "postfix, direct", "--out", "x"]
    everything = driver.parse(driver.parser("fairness", "test"), [])
    assert isinstance(everything, argparse.Namespace)
    assert everything.variants == ("mailsluice", "mailsluice-fcfs", "postfix", "direct")
    assert driver.parse(driver.parser("fairness", "test"), ["--via", "nginx"]) == 2
    assert "unknown variant(s) ['nginx']" in capsys.readouterr().err
    assert driver.parse(driver.parser("fairness", "test"), [], lambda a: "--limit: too small") == 2
    assert "--limit: too small" in capsys.readouterr().err


def test_scenario_options_are_checked() -> None:
    assert fairness_args(["--messages", "0"]) == 2
    assert fairness_args(["--backoff", "0.5"]) == 2
    parsed = resources_args(["--bursts", "10,20", "--scale", "2.5"])
    assert isinstance(parsed, argparse.Namespace)
    assert parsed.burst_counts == (25, 50)
    assert resources_args(["--bursts", "x"]) == 2


# -- the aggregation point's processes ------------------------------------------------------------


def test_parse_stat_counts_fields_after_the_command_name() -> None:
    fields = ["S", "77", "1", "1", "0", "-1", "4194560", "10", "0", "0", "0", "120", "30",
              "7", "3", "20", "0", "1", "0", "555", "1000", "250"]  # fmt: skip
    line = "4242 (a) (b c) " + " ".join(fields) + " 18446744073709551615 1 1 0"
    assert parse_stat(line) == (77, 120 + 30 + 7 + 3, 250)
    with pytest.raises(ValueError, match="stat"):
        parse_stat("4242 (short) S 1 2")
    assert parse_statm("1000 300 120 5 0 200 0\n") == (300, 180)
    io_text = "rchar: 10\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n"
    assert parse_keyed(io_text, "read_bytes", "write_bytes", "absent") == (4096, 8192, 0)


def test_descendants_follow_the_tree_from_live_roots_only() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 21: 20}
    assert descendants([10], parents) == {10, 11, 12, 13}
    assert descendants([10, 99], parents) == {10, 11, 12, 13}  # 99 is gone
    assert descendants([], parents) == set()
    assert cpu_percent(100, 100 + CLK_TCK, 2.0) == pytest.approx(50.0)
    assert cpu_percent(100, 90, 1.0) == 0.0  # a process left: never negative
    assert cpu_percent(0, 10, 0.0) == 0.0


def test_the_msa_hold_setting() -> None:
    held = main_cf(PostfixSpec(name="t1", root=POSTFIX_ROOT, listen="10.253.1.2", mynetworks="x",
                               settings=HOLD_ALL))  # fmt: skip
    assert "smtpd_client_restrictions = check_client_access static:HOLD\n" in held


def test_simulated_msa_bounces_on_5xx_and_refuses_unknown_domains() -> None:
    msa = SimMSA(routes={"mx1.msb.test": ("127.0.0.1", 9)})
    with pytest.raises(ValueError, match="no route"):
        msa.submit(Envelope("x", "a@b", "user@elsewhere.test", b"x"))
