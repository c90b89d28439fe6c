"""Who may connect, and which connections are our own coming back (loops).

``Admission.admit`` decides for each accepted connection, before anything is dialled:

* shutting down: ``421 4.3.2``;
* a client outside the allowed networks: ``421 4.7.1`` (a 4xx: a misconfigured allow
  list defers mail, never bounces it), said once per address in the log;
* a loop: the original destination is one of our own listening addresses, or the
  client's address pair is exactly one of our own live connections to an MX (the
  REDIRECT rule lacks the owner exclusion): ``421 4.4.6``;
* over the global or the per-client connection cap (``policy.limits``): ``421``.

It keeps the set of our live MX connections (``outbound``): the dialler registers each
address pair the moment ``connect()`` has chosen the source port, so the check is
deterministic.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence

from mailsluice.policy import access, limits
from mailsluice.runtime.net.dialer import plain_host
from mailsluice.runtime.net.listener import descriptor_capacity
from mailsluice.runtime.net.origdst import ConnectedSocket
from mailsluice.smtp.replies import Reply

log = logging.getLogger("mailsluice.admission")

Outbound = tuple[str, int, str, int]  # (src ip, src port, dst ip, dst port)
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_CACHE_LIMIT = 4096  # client addresses whose verdict is remembered


class Admission:
    """The allow list, the loop checks and the connection caps of one worker."""

    def __init__(
        self,
        *,
        hostname: str,
        allowed: Sequence[Network],
        caps: limits.Caps,
        transparent: bool,
    ) -> None:
        self._host = hostname
        self._allowed = tuple(allowed)
        self._verdicts: dict[str, bool] = {}  # client IP -> in an allowed network
        self._transparent = transparent
        self.limits = limits.ConnectionCounts(caps)
        self.accepting = True
        self.own_addresses: list[tuple[str, int]] = []  # where we listen
        self.outbound: set[Outbound] = set()  # our live connections to MXes

    def admit(
        self, client_ip: str, destination: tuple[str, int], sock: ConnectedSocket | None
    ) -> Reply | str:
        """A refusal, or the connection slot taken (give it back with ``release``)."""
        host = self._host
        own = self.own_addresses
        if sock is not None and self._transparent:
            own = [*own, sock.getsockname()[:2]]
            # ``destination`` is what this client really dialled, so an exact match with
            # one of our own live connections is that connection, looped
            peer = _plain(sock.getpeername())
            if (*peer, *_plain(destination)) in self.outbound:
                return access.loop_refusal(host)
        if not self.accepting:
            return Reply.make(421, "4.3.2", f"{host} Service shutting down, try again later")
        if not self._allowed_client(client_ip):
            return access.denied(client_ip, host)
        if access.is_loop(destination, own):
            return access.loop_refusal(host)
        return self.limits.acquire(client_ip, host)

    def stranger(self, client_ip: str) -> Reply | None:
        """``421 4.7.1`` for a client outside the allowed networks, whatever else is
        wrong with its connection (no original destination to read); None: allowed."""
        return None if self._allowed_client(client_ip) else access.denied(client_ip, self._host)

    def reconfigure(self, *, hostname: str, allowed: Sequence[Network]) -> None:
        """A reload: the new allow list decides for the next connections (the verdicts
        remembered are forgotten); the counts and the loop checks stay."""
        self._host = hostname
        self._allowed = tuple(allowed)
        self._verdicts = {}

    def release(self, slot: str) -> None:
        self.limits.release(slot)

    def fit_descriptors(self) -> None:
        """Make room for the global cap in RLIMIT_NOFILE, or lower the cap to what fits."""
        caps = self.limits.caps
        capacity = descriptor_capacity(caps.total)
        if capacity < caps.total:
            assert self.limits.total == 0, "caps change only before the first connection"
            self.limits = limits.ConnectionCounts(limits.Caps(capacity, caps.per_client))

    def _allowed_client(self, client_ip: str) -> bool:
        allowed = self._verdicts.get(client_ip)
        if allowed is None:
            if len(self._verdicts) > _CACHE_LIMIT:
                self._verdicts.clear()
            allowed = self._verdicts[client_ip] = access.client_allowed(client_ip, self._allowed)
            if not allowed:  # said once per address: it may be an MSA of ours, misrouted
                log.warning(
                    "refused %s: not in the allowed networks (421 4.7.1, it will retry); "
                    "if it is one of your MSAs, add its network to allow (on the host "
                    'itself, with the OUTPUT REDIRECT: allow = ["local"])',
                    client_ip,
                )
        return allowed


def _plain(address: tuple[str, int] | tuple[str, int, int, int]) -> tuple[str, int]:
    return (plain_host(address[0]), address[1])
