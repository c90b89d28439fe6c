"""``runtime.names.HostNames``: what the host rules' names resolve to, with fake lookups.

An exact name resolves to its addresses; a ``.suffix`` rule names an address by its PTR
name only when that name resolves back to it (forward-confirmed); a name that does not
resolve is a warning, never a failure; ``changed`` is called when the names change."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from mailsluice.policy.destrules import DestinationRule
from mailsluice.runtime.fair.names import HostNames

pytestmark = pytest.mark.unit

FORWARD = {
    "mx1.example.net": frozenset({"192.0.2.1", "2001:db8::1"}),
    "mx9.mail.example.org": frozenset({"192.0.2.9"}),
    "liar.mail.example.org": frozenset({"198.51.100.1"}),
}
REVERSE = {"192.0.2.9": "MX9.Mail.Example.Org.", "192.0.2.66": "liar.mail.example.org"}


async def _forward(name: str) -> frozenset[str]:
    if name not in FORWARD:
        raise OSError("no such name")
    return FORWARD[name]


async def _reverse(address: str) -> str | None:
    if address not in REVERSE:
        raise OSError("no PTR")
    return REVERSE[address]


async def _settled(names: HostNames) -> None:
    task = asyncio.get_running_loop().create_task(names.run())
    for _ in range(20):  # the fake lookups answer at once: a few turns of the loop settle it
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_exact_names_and_confirmed_ptr_names_are_known_and_liars_are_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rules = [
        DestinationRule(host="mx1.example.net", max_connections=3),
        DestinationRule(host=".mail.example.org", max_connections=2),
        DestinationRule(host="gone.example.net", max_connections=1),
    ]
    names = HostNames(rules, forward=_forward, reverse=_reverse)
    changes: list[int] = []
    names.changed = lambda: changes.append(1)
    assert names.needed
    for address in ("192.0.2.9", "192.0.2.66", "192.0.2.77"):
        names.want(address)
    await _settled(names)
    assert names.names_of("192.0.2.1") == {"mx1.example.net"}
    assert names.names_of("::ffff:192.0.2.1") == {"mx1.example.net"}
    assert names.names_of("2001:db8::1") == {"mx1.example.net"}
    assert names.names_of("192.0.2.9") == {"mx9.mail.example.org"}  # normalised, confirmed
    assert names.names_of("192.0.2.66") == frozenset()  # its PTR does not resolve back
    assert names.names_of("192.0.2.77") == frozenset()  # no PTR at all: quietly nothing
    assert changes
    assert "gone.example.net does not resolve" in caplog.text


def test_no_host_rule_needs_no_resolving() -> None:
    names = HostNames([DestinationRule(domain="example.org", max_connections=1)])
    assert not names.needed
    names.want("192.0.2.1")
    assert names.names_of("192.0.2.1") == frozenset()


async def test_a_reload_resolves_new_names_and_forgets_those_no_rule_names() -> None:
    names = HostNames([], forward=_forward, reverse=_reverse)
    changes: list[int] = []
    names.changed = lambda: changes.append(1)
    assert not names.needed
    names.reconfigure([DestinationRule(host="mx1.example.net", max_connections=3)])
    assert names.needed
    await _settled(names)
    assert names.names_of("192.0.2.1") == {"mx1.example.net"}
    changes.clear()
    names.reconfigure([DestinationRule(host="mx9.mail.example.org", max_connections=1)])
    assert names.names_of("192.0.2.1") == frozenset()  # no rule names it any more
    assert changes  # the scheduler checks its rules again
    await _settled(names)
    assert names.names_of("192.0.2.9") == {"mx9.mail.example.org"}
