"""The connection-limited scenarios' figures, in memory: who holds the MX's connections
(attribution, bins, peaks, occupancy, refusals), what the MSAs were told (Postfix log
lines), mailsluice's destinations state, the deadline, the spread over unfinished runs, and
the unequal scenario's light-tenant ratios."""

from __future__ import annotations

import argparse

import pytest

from mailsluice_lab.bench.scenarios import cells, fairness, slots, unequal
from mailsluice_lab.bench.scenarios.measures import MxConnection, Received, Submitted
from mailsluice_lab.bench.scenarios.records import deferrals, reply_code, state_rows
from mailsluice_lab.bench.scenarios.runner import VariantRun

pytestmark = pytest.mark.unit

T = 1_700_000_000.0


def conn(number: int, opened: float, closed: float, client: str = "10.0.0.1") -> MxConnection:
    return MxConnection("mx1", number, client, T + opened, T + closed, "served")


def got(tenant: int, at: float, connection: int, mid: str = "") -> Received:
    return Received("mx1", tenant, mid or f"m{tenant}-{at}", T, T + at, connection)


def test_a_connection_counts_for_the_tenant_whose_message_it_carries_next() -> None:
    connections = [conn(1, 0.0, 10.0), conn(2, 1.0, 2.0),
                   MxConnection("mx1", 0, "10.0.0.1", T + 3, T + 3, "refused")]  # fmt: skip
    received = [got(1, 2.0, 1), got(2, 5.0, 1), got(2, 6.0, 1)]
    pieces = [(a - T, b - T, who) for a, b, who in slots.intervals(connections, received)]
    assert pieces == [(0.0, 2.0, "1"), (2.0, 5.0, "2"), (5.0, 6.0, "2"), (6.0, 10.0, "2"),
                      (1.0, 2.0, slots.NOBODY)]  # fmt: skip


def test_bins_are_exact_means_and_peaks_are_instantaneous() -> None:
    pieces = [(T + 0.0, T + 1.5, "1"), (T + 0.5, T + 1.0, "2"), (T + 1.0, T + 2.0, "2")]
    times, by_tenant = slots.series(pieces, start=T, end=T + 2.0, step=1.0)
    assert times == [0.0, 1.0, 2.0]
    assert by_tenant["1"] == pytest.approx([1.0, 0.5, 0.0])
    assert by_tenant["2"] == pytest.approx([0.5, 1.0, 0.0])
    # a close and an open at the same instant never count as two at once
    assert slots.peaks(pieces) == {"1": 1, "2": 1, "total": 2}
    assert slots.slot_rows("mailsluice", [0.0], {"1": [0.25]}) == [
        ("mailsluice", "0.000", "1", "0.2500")
    ]
    assert slots.series(pieces, start=T, end=T, step=1.0) == ([], {})


def test_occupancy_is_per_client_address_and_refusals_are_counted_after_the_first() -> None:
    connections = [conn(1, 0.0, 10.0), conn(2, 0.0, 5.0),
                   conn(3, 0.0, 10.0, client="10.0.0.2")]  # fmt: skip
    # 10 + 5 + 10 connection-seconds over 10 s, two clients with a limit of 2: 25 / 40
    assert slots.occupancy(connections, start=T, end=T + 10, limit=2) == pytest.approx(0.625)
    assert slots.occupancy([], start=T, end=T + 10, limit=2) is None
    refusals = [MxConnection("mx1", 0, "c", T + t, T + t, "refused") for t in (3.0, 1.0, 2.0)]
    figures = slots.refusal_figures([*connections, *refusals], start=T)
    counts = (figures["refused"], figures["refused_after_first"], figures["refused_later"])
    assert counts == (3, 2, 1)  # the one at 3.0 s is more than 1 s after the first
    assert (figures["first_s"], figures["last_s"], figures["times_s"]) == (1.0, 3.0, [1, 2, 3])
    assert slots.refusal_figures(connections, start=T)["refused_after_first"] == 0


POSTFIX_LOG = """\
Dec 01 17:38:10 t3 postfix-msb-t3/smtp[3319]: 3180A: to=<user@mx1.msb.test>, relay=10.253.200.11[10.253.200.11]:25, delay=1.9, dsn=4.7.0, status=deferred (host 10.253.200.11[10.253.200.11] refused to talk to me: 421 4.7.0 Error: too many connections from 10.253.200.1)
Dec 01 17:38:11 t3 postfix-msb-t3/smtp[3320]: 3180B: to=<user@mx1.msb.test>, relay=none, delay=2, dsn=4.7.0, status=deferred (delivery temporarily suspended: host 10.253.200.11[10.253.200.11] refused to talk to me: 421 4.7.0 Error: too many connections from 10.253.200.1)
Dec 01 17:38:12 t3 postfix-msb-t3/smtp[3321]: 3180C: to=<user@mx1.msb.test>, relay=10.253.200.11[10.253.200.11]:25, delay=3, dsn=4.4.5, status=deferred (host 10.253.200.11[10.253.200.11] said: 451 4.4.5 try again later (in reply to MAIL FROM command))
Dec 01 17:38:13 t3 postfix-msb-t3/smtp[3322]: 3180D: to=<user@mx1.msb.test>, relay=none, delay=3, dsn=4.4.1, status=deferred (connect to 10.253.200.11[10.253.200.11]:25: Connection refused)
Dec 01 17:38:14 t3 postfix-msb-t3/smtp[3323]: 3180E: to=<user@mx1.msb.test>, relay=10.253.200.11[10.253.200.11]:25, delay=1, dsn=2.0.0, status=sent (250 2.0.0 Ok: queued as S000001)
"""  # noqa: E501


def test_the_msas_deferrals_are_counted_by_the_reply_that_caused_them() -> None:
    assert deferrals(POSTFIX_LOG) == {"421": 1, "451": 1, "no reply": 1, "suspended": 1}
    assert deferrals("") == {}
    assert reply_code("host x said: 421-4.7.0 first line") == "421"
    assert cells.codes({"421": 3, "suspended": 40}) == (
        "421: 3 (+ 40 deferred unsent: delivery suspended)"
    )
    assert (cells.codes({}), cells.codes(None)) == ("0", "-")


def test_the_destinations_state_becomes_a_row_per_tenant() -> None:
    state = {"at": T, "destinations": [{
        "destination": "10.253.200.11:25", "limit": 10, "learned": True, "in_use": 10,
        "waiting": 3, "tenants": {"10.253.2.2": {"busy": 4, "idle": 1, "waiting": 1},
                                  "10.253.1.2": {"busy": 5, "idle": 0, "waiting": 2}},
    }]}  # fmt: skip
    assert state_rows(state) == [
        (T, "10.253.200.11:25", 10, True, 10, 3, "10.253.1.2", 5, 0, 2),
        (T, "10.253.200.11:25", 10, True, 10, 3, "10.253.2.2", 4, 1, 1),
    ]
    assert state_rows({"at": T, "destinations": [{"destination": "d", "limit": 5}]}) == [
        (T, "d", 5, False, 0, 0, "", 0, 0, 0)
    ]
    assert state_rows([]) == []


def test_the_deadline_follows_the_backoff() -> None:
    assert fairness.default_deadline(1.0) == 240.0
    assert fairness.default_deadline(300.0) == 420.0


def _entry(status: str, completion: float | None, refused: int, told: dict[str, int]) -> dict:
    return {"status": status,
            "fairness": {"completion_s": completion, "jain_index": 0.99,
                         "slowest_fastest_ratio": 1.02},
            "at_mx": {"refusals": {"refused": refused, "refused_after_first": refused - 1}},
            "told": {"counted": True, "msa_total": told}}  # fmt: skip


def test_the_spread_leaves_out_the_runs_that_did_not_finish_but_counts_their_refusals() -> None:
    variants = {
        "mailsluice-fcfs": _entry("ok", 30.0, 10, {"421": 10}),
        "mailsluice-fcfs#2": _entry("incomplete", 25.0, 40, {"421": 40, "suspended": 500}),
        "mailsluice-fcfs#3": _entry("ok", 50.0, 20, {"421": 20}),
    }
    spread = fairness.spreads(variants)["mailsluice-fcfs"]
    assert spread["unfinished"] == 1
    assert (spread["completion_s"]["runs"], spread["completion_s"]["median"]) == (2, 40.0)
    assert (spread["mx_421"]["runs"], spread["mx_421"]["median"]) == (3, 20)
    assert spread["msa_421"]["max"] == 40
    assert spread["msa_deferrals"]["max"] == 540


def _run(received: list[Received], sent: dict[int, int], status: str = "ok") -> VariantRun:
    submitted = tuple(
        Submitted(t, "mx1", f"m{t}-{k}", T) for t, n in sent.items() for k in range(n)
    )
    return VariantRun("mailsluice", status, "", T - 10, 0.0, 1.0, submitted=submitted,
                      received=tuple(received), released_at=T)  # fmt: skip


def test_a_light_tenant_is_compared_with_its_median_time_alone() -> None:
    args = argparse.Namespace(heavy=4, light=2, light_messages=2, light_rate=0.0)
    assert [(b.tenant, b.count) for b in unequal.shared_plan(args).batches] == [
        (1, 4), (2, 2), (3, 2),
    ]  # fmt: skip
    assert [(b.tenant, b.count) for b in unequal.alone_plan(args, 3).batches] == [(3, 2)]
    received = [got(1, 9.0, 1, f"m1-{k}") for k in range(4)]
    received += [got(2, 1.0, 2, "m2-0"), got(2, 2.4, 2, "m2-1")]
    received += [got(3, 1.0, 3, "m3-0"), got(3, 1.5, 3, "m3-1")]
    run = _run(received, {1: 4, 2: 2, 3: 2})
    assert unequal.completion(run, 2) == pytest.approx(2.4)
    figures = unequal.light_figures(run, [2, 3], {"2": [2.0, 1.8, 2.2], "3": [1.5]})
    assert figures["tenants"]["2"] == {"with_heavy_s": pytest.approx(2.4), "alone_s": 2.0,
                                       "alone_runs": 3, "ratio": 1.2}  # fmt: skip
    assert (figures["worst_ratio"], figures["median_ratio"]) == (1.2, 1.1)
    assert figures["goal_met"] is True
    assert figures["heavy_completion_s"] == pytest.approx(9.0)
    missing = _run(received[:-1], {1: 4, 2: 2, 3: 2}, status="incomplete")
    assert unequal.completion(missing, 3) is None
    unmet = unequal.light_figures(missing, [2, 3], {"2": [2.0], "3": [1.5]})
    assert (unmet["worst_ratio"], unmet["goal_met"], unmet["light_completion_max_s"]) == (
        None, None, None,
    )  # fmt: skip


def test_paced_light_tenants_send_a_batch_a_second_from_their_start() -> None:
    args = argparse.Namespace(heavy=50, light=2, light_messages=5, light_rate=2.0,
                              light_start=3.0)  # fmt: skip
    alone = [(b.at, b.tenant, b.count) for b in unequal.alone_plan(args, 2).batches]
    assert alone == [(3.0, 2, 2), (4.0, 2, 2), (5.0, 2, 1)]
    shared = unequal.shared_plan(args)
    assert shared.batches[0] == unequal.Batch(0.0, 1, "mx1", 50)  # the heavy one, at once
    assert shared.per_tenant() == {1: 50, 2: 5, 3: 5}
    slow = argparse.Namespace(light_messages=2, light_rate=0.5, light_start=0.0)
    assert [b.at for b in unequal.light_batches(slow, 2, "mx1")] == [0.0, 2.0]
