"""What TLS toward the MX costs mailsluice, from the relay benchmark's TLS variants.

Per repeat (the variants of one repeat run one after the other, so they share the
machine's state): the proxy's CPU per message of each variant, and what TLS adds to it
over the baseline (``mailsluice-tls-off``: the same STARTTLS front, no STARTTLS offered):
with a full handshake per message (``mailsluice-tls``, ``-tls12``) and with resumption
(``-tls-resume``, ``-tls12-resume``). The ratio resumed / full of those additions is what
resumption leaves of a handshake's cost, seen end to end (the STARTTLS exchange, the
second EHLO and the records of the message are in both); its median and range over the
repeats, and msg/s both ways, go into relay.json (``tls_resumption``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

BASELINE = "mailsluice-tls-off"
PAIRS = (("1.3", "mailsluice-tls", "mailsluice-tls-resume"),
         ("1.2", "mailsluice-tls12", "mailsluice-tls12-resume"))  # fmt: skip


def _cpu_ms_per_message(run: Mapping[str, object]) -> float | None:
    cpu, received = run.get("cpu_seconds"), run.get("received")
    if run.get("status") != "ok" or not isinstance(cpu, int | float):
        return None
    if not isinstance(received, int) or received <= 0:
        return None
    return float(cpu) * 1000 / received


def _spread(values: Sequence[float], digits: int = 3) -> dict[str, object]:
    if not values:
        return {"median": None, "min": None, "max": None, "runs": []}
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "runs": [round(v, digits) for v in values],
    }


def tls_resumption(runs: Sequence[Mapping[str, object]]) -> dict[str, object] | None:
    """The TLS figures of a report's runs; None when no TLS pair ran with its baseline."""
    by_repeat: dict[object, dict[str, Mapping[str, object]]] = {}
    for run in runs:
        by_repeat.setdefault(run.get("repeat"), {})[str(run.get("variant"))] = run
    out: dict[str, object] = {}
    for version, full, resumed in PAIRS:
        added_full, added_resumed, ratios = [], [], []
        rates: dict[str, list[float]] = {full: [], resumed: [], BASELINE: []}
        for variants in by_repeat.values():
            for name, rate_list in rates.items():
                rate = variants.get(name, {}).get("msg_per_s")
                if isinstance(rate, int | float) and variants[name].get("status") == "ok":
                    rate_list.append(float(rate))
            base, a, b = (
                _cpu_ms_per_message(variants[name]) if name in variants else None
                for name in (BASELINE, full, resumed)
            )
            if base is None or a is None or b is None or a - base <= 0:
                continue
            added_full.append(a - base)
            added_resumed.append(b - base)
            ratios.append((b - base) / (a - base))
        if not ratios:
            continue
        out[f"tls{version}"] = {
            "cpu_ms_per_message_added_full": _spread(added_full),
            "cpu_ms_per_message_added_resumed": _spread(added_resumed),
            "ratio_resumed_vs_full": _spread(ratios),
            "msg_per_s": {name: _spread(values, 1) for name, values in rates.items()},
        }
    return out or None


def format_lines(figures: Mapping[str, object]) -> list[str]:
    """The table's lines for ``tls_resumption``."""
    lines = []
    for version, entry in figures.items():
        assert isinstance(entry, Mapping)
        ratio, full, resumed = (
            entry["ratio_resumed_vs_full"],
            entry["cpu_ms_per_message_added_full"],
            entry["cpu_ms_per_message_added_resumed"],
        )
        assert isinstance(ratio, Mapping)
        assert isinstance(full, Mapping)
        assert isinstance(resumed, Mapping)
        lines.append(
            f"{version}: CPU added per message over {BASELINE}: full handshake "
            f"{full['median']} ms, resumed {resumed['median']} ms; resumed/full "
            f"{ratio['median']} ({ratio['min']}-{ratio['max']} over {len(ratio['runs'])} repeats)"
        )
    return lines
