"""Connection caps (pure): how many sessions one worker relays at once, in total and per
client address, and how many its file-descriptor limit can carry.

Invariant I9: connection counts are capped in total (``max_connections``, per worker) and
per client address (``max_connections_per_client``, 0 = no per-client cap). A connection
over a cap is refused before the MX is dialled, with a 421 the client retries:

* this client already holds its share: ``421 4.7.0 <host> Error: too many connections from
  <ip>`` (Postfix's text; checked first, since it stays true when the proxy has room);
* the worker is full: ``421 4.3.2 <host> Error: too many connections, try again later``.

Only admitted (relayed) sessions hold a slot; a refused connection holds none. Client
addresses are counted exactly (an IPv4-mapped IPv6 address counts as the IPv4 address).

``session_capacity`` turns a descriptor limit into a session count (each session holds two
sockets, client and MX), so that the global cap answers 421 before ``accept()`` or the
MX ``socket()`` runs out of descriptors.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from mailsluice.smtp.replies import Reply

#: Descriptors kept free beyond the sessions' own: connections being refused (one socket
#: each until the 421 is written), DNS look-ups, the log, whatever the runtime opens.
FD_HEADROOM = 64
FDS_PER_SESSION = 2


@dataclass(frozen=True, slots=True)
class Caps:
    """``total``: sessions at once (at least 1); ``per_client``: per address, 0 = no cap."""

    total: int
    per_client: int = 0


def client_key(client_ip: str) -> str:
    """The address a client is counted under: canonical text, ``::ffff:a.b.c.d`` as IPv4,
    any ``%scope`` dropped. Text that is not an address (a Unix socket) counts as itself."""
    try:
        address = ipaddress.ip_address(client_ip.split("%", 1)[0])
    except ValueError:
        return client_ip
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def too_many_total(hostname: str) -> Reply:
    return Reply.make(421, "4.3.2", f"{hostname} Error: too many connections, try again later")


def too_many_from(client: str, hostname: str) -> Reply:
    return Reply.make(421, "4.7.0", f"{hostname} Error: too many connections from {client}")


def refusal(caps: Caps, total: int, from_client: int, client: str, hostname: str) -> Reply | None:
    """The 421 for one more connection from ``client``, given the sessions already held
    (``total``, ``from_client``), or None when it may be relayed."""
    if caps.per_client and from_client >= caps.per_client:
        return too_many_from(client, hostname)
    if total >= caps.total:
        return too_many_total(hostname)
    return None


_KEY_CACHE = 4096  # client addresses whose key is remembered


class ConnectionCounts:
    """The sessions one worker holds, in total and per client address.

    ``acquire`` decides and, when it admits, takes a slot; every admitted connection must
    ``release`` its key exactly once when it ends. Memory is bounded by the number of
    clients with a live session (a client's entry goes when its count reaches 0).
    """

    __slots__ = ("_caps", "_keys", "_per_client", "_total")

    def __init__(self, caps: Caps) -> None:
        if caps.total < 1 or caps.per_client < 0:
            raise ValueError(f"invalid connection caps {caps}")
        self._caps = caps
        self._total = 0
        self._per_client: dict[str, int] = {}
        self._keys: dict[str, str] = {}  # client_key of recent addresses (parsing is slow)

    def _key(self, client_ip: str) -> str:
        key = self._keys.get(client_ip)
        if key is None:
            if len(self._keys) >= _KEY_CACHE:
                self._keys.clear()
            key = self._keys[client_ip] = client_key(client_ip)
        return key

    @property
    def caps(self) -> Caps:
        return self._caps

    @property
    def total(self) -> int:
        return self._total

    def count(self, client_ip: str) -> int:
        return self._per_client.get(self._key(client_ip), 0)

    def acquire(self, client_ip: str, hostname: str) -> str | Reply:
        """Admitted: the key a slot is now held under (give it to ``release``). Refused:
        the reply to send; nothing is held."""
        key = self._key(client_ip)
        held = self._per_client.get(key, 0)
        reply = refusal(self._caps, self._total, held, key, hostname)
        if reply is not None:
            return reply
        self._per_client[key] = held + 1
        self._total += 1
        return key

    def release(self, key: str) -> None:
        """Give back a slot taken by ``acquire`` (a key it never returned is a bug)."""
        held = self._per_client.get(key, 0)
        if held <= 0 or self._total <= 0:
            raise ValueError(f"release of a slot never acquired: {key!r}")
        self._total -= 1
        if held == 1:
            del self._per_client[key]
        else:
            self._per_client[key] = held - 1


def session_capacity(fd_limit: int, fds_in_use: int) -> int:
    """How many sessions fit in ``fd_limit`` descriptors (RLIMIT_NOFILE) when
    ``fds_in_use`` are open already, keeping ``FD_HEADROOM`` free; at least 1."""
    return max(1, (fd_limit - fds_in_use - FD_HEADROOM) // FDS_PER_SESSION)


def fds_needed(sessions: int, fds_in_use: int) -> int:
    """The descriptor limit ``sessions`` sessions need (inverse of ``session_capacity``)."""
    return fds_in_use + FD_HEADROOM + FDS_PER_SESSION * sessions
