"""The host names of the ``[[destinations]]`` rules, resolved (``HostNames``).

A host rule names an MX by its name; the proxy knows an MX only by the address the
client connected to. So the names are resolved where the scheduler runs (this process,
or the broker with several workers), off the event loop (the loop's ``getaddrinfo`` and
``getnameinfo``, which run in a thread or in libuv's pool), by one task (``run``):

* an exact name (``mx1.example.net``): to its addresses, at start and again every
  ``resolve_every`` seconds (the rule's);
* a suffix (``.example.net``): each destination's address back to its name (PTR) when
  the destination is first seen, and again every ``resolve_every`` seconds (the shortest
  of the suffix rules'). The name counts only if it resolves to that address again
  (forward-confirmed: anyone may write any PTR record for their own addresses).

The names an address is known by (``names_of``) are what a host rule is matched against
(``policy.destrules``); when they change, ``changed`` is called (the scheduler then checks
its destinations' rules again). A name that does not resolve is a warning naming it,
once until it resolves again, never a failure: its rule matches nothing meanwhile, or,
if the name resolved before, the addresses it had.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
from collections.abc import Awaitable, Callable, Sequence

from mailsluice.policy.destrules import DestinationRule, normal_name

__all__ = ["HostNames"]

log = logging.getLogger("mailsluice.names")

Forward = Callable[[str], Awaitable[frozenset[str]]]  # a name -> its addresses
Reverse = Callable[[str], Awaitable[str | None]]  # an address -> its PTR name, if any

_TIMEOUT = 10.0  # seconds one lookup may take


async def _forward(name: str) -> frozenset[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(name, None, type=socket.SOCK_STREAM)
    return frozenset(str(info[4][0]).partition("%")[0] for info in infos)


async def _reverse(address: str) -> str | None:
    name, _ = await asyncio.get_running_loop().getnameinfo((address, 0), socket.NI_NAMEREQD)
    return name


class HostNames:
    """What the host rules' names resolve to (see the module docstring)."""

    def __init__(
        self,
        rules: Sequence[DestinationRule],
        *,
        forward: Forward = _forward,
        reverse: Reverse = _reverse,
        timeout: float = _TIMEOUT,
    ) -> None:
        self._forward = forward
        self._reverse = reverse
        self._timeout = timeout
        self._every: dict[str, float] = {}  # an exact name -> seconds between resolutions
        self._ptr_every: float | None = None
        self._addresses: dict[str, frozenset[str]] = {}  # an exact name -> its addresses
        self._ptr: dict[str, str | None] = {}  # an address -> its confirmed name
        self._known: dict[str, frozenset[str]] = {}  # an address -> its names (derived)
        self._due: dict[tuple[bool, str], float] = {}
        self._failing: set[str] = set()
        self._wake = asyncio.Event()
        self.changed: Callable[[], None] = lambda: None
        self.reconfigure(rules)

    def reconfigure(self, rules: Sequence[DestinationRule]) -> None:
        """The rules' names (at start, and at a reload): a new name is resolved at once,
        one no rule names any more is forgotten; what was resolved is kept."""
        every: dict[str, float] = {}
        for rule in rules:
            if rule.host is not None and not rule.host.startswith("."):
                every[rule.host] = min(every.get(rule.host, math.inf), rule.resolve_every)
        suffixes = [r.resolve_every for r in rules if r.host and r.host.startswith(".")]
        self._every, self._ptr_every = every, (min(suffixes) if suffixes else None)
        for forward, text in list(self._due):
            if (forward and text not in every) or (not forward and self._ptr_every is None):
                del self._due[(forward, text)]
        for name in every:
            self._due.setdefault((True, name), -math.inf)
        if self._addresses.keys() - every.keys():
            self._addresses = {n: a for n, a in self._addresses.items() if n in every}
            self._recompute()
        self._wake.set()

    @property
    def needed(self) -> bool:
        """Whether any rule names a host (else nothing is ever resolved)."""
        return bool(self._every) or self._ptr_every is not None

    def names_of(self, address: str) -> frozenset[str]:
        return self._known.get(address.removeprefix("::ffff:"), frozenset())

    def want(self, address: str) -> None:
        """A new destination: its name is looked up if a suffix rule needs it."""
        address = address.removeprefix("::ffff:")
        if self._ptr_every is not None and (False, address) not in self._due:
            self._due[(False, address)] = -math.inf
            self._wake.set()

    async def run(self) -> None:
        """Resolve what is due, then sleep until the next is (or a new address comes);
        until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            for job in [job for job, at in self._due.items() if at <= loop.time()]:
                forward, text = job
                changed = await (self._resolve(text) if forward else self._name(text))
                every = self._every[text] if forward else self._ptr_every
                self._due[job] = loop.time() + (every or math.inf)
                if changed:
                    self._recompute()
            self._wake.clear()
            due = min(self._due.values(), default=math.inf)
            wait = None if math.isinf(due) else max(0.0, due - loop.time())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def _lookup(
        self, what: str, lookup: Awaitable[object], *, quiet: bool = False
    ) -> object | None:
        """``lookup``'s answer; None when ``what`` does not resolve (said once: a warning
        for a rule's name, quietly for a destination's PTR, which many addresses lack)."""
        try:
            async with asyncio.timeout(self._timeout):
                found = await lookup
        except (OSError, UnicodeError, TimeoutError, ValueError) as exc:
            if quiet:
                log.debug("destinations: no name for %s (%s)", what, exc)
            elif what not in self._failing:
                self._failing.add(what)
                log.warning("destinations: %s does not resolve (%s); its rule waits for it "
                            "(a host rule needs a name in DNS or /etc/hosts)",
                            what, exc or type(exc).__name__)  # fmt: skip
            return None
        if what in self._failing:
            self._failing.discard(what)
            log.info("destinations: %s resolves again", what)
        return found

    async def _resolve(self, name: str) -> bool:
        found = await self._lookup(name, self._forward(name))
        if not isinstance(found, frozenset) or not found or found == self._addresses.get(name):
            return False
        self._addresses[name] = found
        log.info("destinations: %s is %s", name, ", ".join(sorted(found)))
        return True

    async def _name(self, address: str) -> bool:
        """The PTR name of ``address``, kept if it resolves back to it."""
        found = await self._lookup(address, self._reverse(address), quiet=True)
        name = normal_name(found) if isinstance(found, str) else None
        if name is not None and not name.startswith("."):
            back = await self._lookup(name, self._forward(name), quiet=True)
            if not isinstance(back, frozenset) or address not in back:
                name = None
        else:
            name = None
        if self._ptr.get(address) == name and address in self._ptr:
            return False
        self._ptr[address] = name
        return True

    def _recompute(self) -> None:
        known: dict[str, set[str]] = {}
        for name, addresses in self._addresses.items():
            for address in addresses:
                known.setdefault(address, set()).add(name)
        for address, ptr in self._ptr.items():
            if ptr is not None:
                known.setdefault(address, set()).add(ptr)
        self._known = {address: frozenset(names) for address, names in known.items()}
        self.changed()
