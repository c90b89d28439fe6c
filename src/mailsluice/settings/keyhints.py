"""What an unknown configuration key probably meant: ``did you mean ...?`` (pure).

Every table of the configuration refuses a key it does not know (a typo must not be a
setting silently ignored); the refusal names the nearest known key of that table, or
the table a known key belongs to when it was written in the wrong one
(``hold_max`` under ``[timeouts]`` instead of ``[fair_sharing]``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

__all__ = ["TABLE_KEYS", "hint"]

#: the keys of each table, for the hints (the parsers themselves decide what is valid)
TABLE_KEYS: Mapping[str, tuple[str, ...]] = {
    "fair_sharing": ("enabled", "start", "ceiling", "quiet", "hold_max", "idle_timeout",
                     "max_age", "max_transactions"),
    "timeouts": ("connect", "greeting", "helo", "mail", "data_init", "data_block",
                 "data_done", "client_idle", "client_data", "quit", "client_min_rate"),
    "tls_policy": ("default_level", "dane", "mta_sts", "trust_ad", "resumption", "tlsrpt",
                   "resolver", "ca_file", "report_org", "report_contact", "mta_sts_port"),
    "filtering": ("timeout", "on_failure", "memory_limit", "spool_dir", "keepalive"),
}  # fmt: skip


def hint(key: str, known: Iterable[str], table: str | None = None) -> str:
    """``"; did you mean 'x'?"``, or where ``key`` belongs, or ``""`` (nothing close).
    ``table``: the table ``key`` was found in (None: the top level)."""
    choices = sorted(set(known))
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.75)
    if close:
        return f"; did you mean {_shown(close[0], table)}?"
    for other, keys in TABLE_KEYS.items():
        if other != table and key in keys:
            return f"; {key} is set in [{other}] ({other}.{key})"
    return ""


def _shown(key: str, table: str | None) -> str:
    if table is None and key in _TABLES:
        return f"[{key}]"
    if table is None and key in _ARRAYS:
        return f"[[{key}]]"
    return repr(key)


_TABLES = frozenset({"fair_sharing", "tls_policy", "timeouts", "filtering"})
_ARRAYS = frozenset(
    {"destinations", "tenants", "deferral_rules", "tls_policies", "source_addresses",
     "source_rules", "filters", "plugins"}
)  # fmt: skip
