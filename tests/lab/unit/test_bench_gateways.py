"""``mailsluice bench fairness --gateways N`` (issue 26): the options, the tenants' spread
over the gateways, the ideal completion."""

from __future__ import annotations

import argparse

import pytest

from mailsluice_lab.bench.scenarios import fairness
from mailsluice_lab.bench.scenarios.gateways import assign
from mailsluice_lab.bench.scenarios.measures import Received
from mailsluice_lab.bench.scenarios.runner import FLEET_VARIANTS, VariantRun

pytestmark = pytest.mark.unit


def test_gateways_two_runs_the_fleets_variants() -> None:
    args = fairness.parse_args(["--gateways", "2", "--msa", "sim"])
    assert isinstance(args, argparse.Namespace)
    assert tuple(args.variants) == FLEET_VARIANTS
    assert fairness.setup(args).options["gateways"] == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["--gateways", "2", "--via", "mailsluice"],  # one gateway's variant with two
        ["--via", "mailsluice-shared"],  # a fleet's variant with one
        ["--gateways", "4", "--tenants", "3"],  # more gateways than tenants
    ],
)
def test_what_does_not_go_together_is_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert fairness.parse_args(argv) == 2
    assert "error" in capsys.readouterr().err


def test_the_first_gateways_take_the_most_tenants() -> None:
    assert assign((1, 2, 3), 2) == {1: 1, 2: 1, 3: 2}
    assert assign((1, 2, 3), 3) == {1: 1, 2: 2, 3: 3}
    assert assign((1, 2, 3, 4, 5), 2) == {1: 1, 2: 1, 3: 1, 4: 2, 5: 2}


def test_the_ideal_is_a_busy_connections_pace_over_the_limit() -> None:
    received = tuple(
        Received("mx1", 1, f"m{c}-{n}", 0.0, 10.0 + 0.1 * n, connection=c)
        for c in (1, 2)
        for n in range(10)
    )  # two connections, a delivery every 0.1 s on each
    run = VariantRun("x", "ok", "", 0.0, 0.0, 0.0, received=received)
    figures = fairness.ideal(run, completion=1.5, limit=2)
    assert figures["ideal_s"] == pytest.approx(1.0)  # 20 messages x 0.1 s / 2
    assert figures["completion_over_ideal"] == pytest.approx(1.5)
