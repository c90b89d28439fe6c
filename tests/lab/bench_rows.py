"""Synthetic deliveries and runs for the tests of the bench scenarios' figures and outputs."""

from __future__ import annotations

from typing import Any

from mailsluice_lab.bench.scenarios.runner import VariantRun
from mailsluice_lab.bench.scenarios.stats import Delivery

T0 = 1_700_000_000.0


def congestion_rows() -> list[Delivery]:
    """mailsluice: healthy MXs at 0.1 s latency; postfix: healthy latency grows with the tarpit."""
    rows = []
    for variant, slow in (("mailsluice", 0.0), ("postfix", 2.0)):
        for k in range(20):
            sent = T0 + k
            rows.append(Delivery(variant, "congestion", "1", "mx1", f"{variant}-a{k}", sent,
                                 sent + 0.1 + slow * k, 0.1 + slow * k))  # fmt: skip
            rows.append(Delivery(variant, "congestion", "2", "mx2", f"{variant}-b{k}", sent,
                                 sent + 0.1 + slow * k, 0.1 + slow * k))  # fmt: skip
        for k in range(5):  # the tarpit: 5 of 100 arrive, 30 s each
            sent = T0 + k
            rows.append(Delivery(variant, "congestion", "3", "mx3", f"{variant}-c{k}", sent,
                                 sent + 30 * (k + 1), 30.0 * (k + 1)))  # fmt: skip
    return rows


def fairness_rows() -> list[Delivery]:
    """10 messages per tenant; mailsluice: tenant 1 done at 10 s, tenant 3 at 20 s; postfix even."""
    rows = []
    finish = {
        "mailsluice": {"1": 10.0, "2": 15.0, "3": 20.0},
        "postfix": dict.fromkeys("123", 30.0),
    }
    for variant, per_tenant in finish.items():
        for tenant, end in per_tenant.items():
            for k in range(10):
                received = T0 + end * (k + 1) / 10
                rows.append(Delivery(variant, "fairness", tenant, "mx1", f"{variant}{tenant}-{k}",
                                     T0, received, received - T0))  # fmt: skip
    return rows


def variant_run(variant: str, **fields: object) -> VariantRun:
    """A finished run of ``variant`` (status ok unless ``fields`` say otherwise)."""
    values: dict[str, Any] = {"status": "ok", "note": "", "started_at": 100.0,
                              "injection_s": 0.0, "wall_s": 1.0, **fields}  # fmt: skip
    return VariantRun(variant=variant, **values)
