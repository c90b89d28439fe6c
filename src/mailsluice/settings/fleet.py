"""``shared_state`` and ``gateway_name``: several gateways sharing one set of limits.

``shared_state`` names the Redis that holds the fleet's state (``runtime.fleet``):

* ``redis://[:PASSWORD@]HOST:PORT[/DB]``, ``rediss://...`` (TLS);
* ``redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``: the master of
  ``SERVICE`` as Sentinel names it (Redis's own failover).

A password may also come from a file (``?password_file=/etc/mailsluice/redis.pass``),
which keeps it out of the configuration. ``gateway_name`` names this gateway in the
fleet and in the session log (default: the host name).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

from mailsluice.settings.values import SettingsError

__all__ = ["SharedState", "SharedStateError", "default_gateway_name", "parse_shared_state"]

_EXAMPLE = "e.g. redis://10.0.0.5:6379/0 or redis+sentinel://10.0.0.5:26379,10.0.0.6:26379/mymaster"
_SCHEMES = ("redis", "rediss", "redis+sentinel")


class SharedStateError(SettingsError):
    """The setting is wrong; the message names the key and the fix."""


@dataclass(frozen=True, slots=True)
class SharedState:
    url: str = field(repr=False)  # as configured (shown without its password: ``shown``)
    tls: bool = False
    hosts: tuple[tuple[str, int], ...] = ()  # the server, or the Sentinels
    db: int = 0
    password: str | None = field(default=None, repr=False)
    password_file: str | None = None
    service: str | None = None  # Sentinel's name of the master

    @property
    def shown(self) -> str:
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        scheme = "redis+sentinel" if self.service else ("rediss" if self.tls else "redis")
        path = f"/{self.service}" if self.service else ""
        return f"{scheme}://{hosts}{path}/{self.db}"


def _host_port(text: str, default: int) -> tuple[str, int]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = text.partition(":")
    if not host or (port and not port.isdigit()) or not 0 < int(port or default) < 65536:
        raise SharedStateError(f"shared_state: {text!r} is not HOST:PORT ({_EXAMPLE})")
    return host, int(port or default)


def parse_shared_state(url: str) -> SharedState:
    """The ``shared_state`` URL, checked (see the module docstring)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in _SCHEMES:
        raise SharedStateError(
            f"shared_state: {url!r}: the scheme must be redis://, rediss:// or "
            f"redis+sentinel:// ({_EXAMPLE})"
        )
    netloc = parts.netloc
    password: str | None = None
    if "@" in netloc:
        auth, _, netloc = netloc.rpartition("@")
        password = unquote(auth.partition(":")[2] if ":" in auth else auth) or None
    if not netloc:
        raise SharedStateError(f"shared_state: {url!r} names no host ({_EXAMPLE})")
    sentinel = parts.scheme == "redis+sentinel"
    default = 26379 if sentinel else 6379
    hosts = tuple(_host_port(item, default) for item in netloc.split(","))
    if len(hosts) > 1 and not sentinel:
        raise SharedStateError(
            f"shared_state: {url!r}: several hosts need redis+sentinel:// ({_EXAMPLE})"
        )
    path = [p for p in parts.path.split("/") if p]
    service = None
    if sentinel:
        if not path:
            raise SharedStateError(
                f"shared_state: {url!r}: name the master after the Sentinels "
                "(redis+sentinel://HOST:26379/SERVICE)"
            )
        service, path = path[0], path[1:]
    if len(path) > 1 or (path and not path[0].isdigit()):
        raise SharedStateError(f"shared_state: {url!r}: the database is a number (/0)")
    query = parse_qs(parts.query)
    unknown = set(query) - {"password_file"}
    if unknown:
        raise SharedStateError(
            f"shared_state: {url!r}: unknown option {sorted(unknown)[0]!r} "
            "(only password_file=PATH)"
        )
    password_file = query.get("password_file", [None])[-1]
    return SharedState(
        url=url, tls=parts.scheme == "rediss", hosts=hosts, db=int(path[0]) if path else 0,
        password=password, password_file=password_file, service=service,
    )  # fmt: skip


def parse_gateway_name(raw: str) -> str:
    name = raw.strip()
    if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name):
        raise SharedStateError(
            f"gateway_name: {raw!r}: 1 to 64 letters, digits, '-', '_' or '.' (e.g. gw-a)"
        )
    return name


def default_gateway_name() -> str:
    """The host name (its first label), as the session log and the fleet name a gateway."""
    return socket.gethostname().split(".")[0] or "gateway"
