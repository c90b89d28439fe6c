"""Configuration: the TOML file and the command-line flags, merged into one frozen value.

Flags override the file; the file overrides the embedded defaults. Every problem is
reported with the TOML key it concerns and what to write instead (``ConfigError``).
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from mailsluice.relay.config import BareNewlinePolicy, RelayConfig, Timeouts, TlsMode
from mailsluice.settings.fair import FairSettings
from mailsluice.settings.fair import parse as parse_fair
from mailsluice.settings.filters import (
    FilteringSettings,
    FilterSpec,
    PluginSpec,
    parse_filtering,
    parse_filters,
    parse_plugins,
)
from mailsluice.settings.fleet import (
    SharedState,
    parse_gateway_name,
    parse_shared_state,
)
from mailsluice.settings.keyhints import TABLE_KEYS, hint
from mailsluice.settings.logplace import DEFAULT_LOG as DEFAULT_LOG
from mailsluice.settings.sources import SourceSettings
from mailsluice.settings.sources import check as check_sources
from mailsluice.settings.sources import parse as parse_sources
from mailsluice.settings.tls import CLIENT_KEYS, TlsSettings
from mailsluice.settings.tls import parse as parse_tls
from mailsluice.settings.values import Network, SettingsError, network, number

DEFAULT_LISTEN = "127.0.0.1:10025"
#: in ``allow``: this host's own addresses, read from its interfaces at start
#: (``runtime.localaddrs``): the clients of the same-host OUTPUT REDIRECT
ALLOW_LOCAL: Literal["local"] = "local"
DEFAULT_ALLOW: tuple[str, ...] = (
    ALLOW_LOCAL,
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "fc00::/7",
)


#: every key of the top level (a table's name included), for ``did you mean``
TOP_KEYS = (
    "listen", "upstream", "outbound_ip", "allow", "log", "state_file", "admin_listen",
    "admin_token_file", "admin_allowed_hosts", "log_queue_limit", "workers", "max_connections",
    "max_connections_per_client", "shutdown_grace", "reuse_connections", "reuse_idle_timeout",
    "reuse_max_age", "reuse_max_idle", "reuse_max_sessions", "log_process", "verbose",
    "message_size_limit", "max_recipients", "bare_newline", "tls", "log_headers", "xverp",
    "hostname", "timeouts", "log_sinks", "filtering", "filters", "plugins", "fair_sharing",
    "destinations", "tenants", "deferral_rules", *CLIENT_KEYS, "tls_policy", "tls_policies",
    "source_addresses", "source_rules", "source_penalty", "shared_state", "gateway_name",
)  # fmt: skip

AllowEntry = Network | Literal["local"]


class ConfigError(SettingsError):
    """A configuration value is wrong; the message names the key and the fix (every
    other ``SettingsError`` becomes one when the settings are read)."""


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    # one address, or several (``listen = ["0.0.0.0:10025", "[::]:10025"]``): read it
    # through ``listen_addresses``. (A single HostPort stays accepted for code that builds
    # Settings itself.)
    listen: HostPort | tuple[HostPort, ...] = field(
        default_factory=lambda: parse_host_port(DEFAULT_LISTEN, "listen")
    )
    upstream: HostPort | None = None  # None = transparent (SO_ORIGINAL_DST)
    outbound_ip: str | None = None
    # client networks; ``"local"`` (ALLOW_LOCAL) stands for this host's own addresses,
    # read from its interfaces when the proxy starts (``runtime.localaddrs``)
    allow: tuple[AllowEntry, ...] = field(
        default_factory=lambda: _allow(list(DEFAULT_ALLOW), "allow")
    )
    # None: the default place (``logplace``: /var/lib/mailsluice/sessions.db, or a
    # fallback said on stderr), resolved when the log is opened; else a log URL
    log: str | None = None
    log_queue_limit: int = 100_000  # records held for the log writer before dropping
    log_process: bool = True  # write the log from a child process (off: a thread)
    max_connections: int = 1000  # sessions per worker; over it: 421 4.3.2
    # sessions per client address per worker, 0 = no cap; over it: 421 4.7.0. 200 = twice
    # Postfix's default_process_limit: one MSA's outbound connections all come from one
    # address, and the cap must not regulate legitimate traffic (only a runaway client).
    max_connections_per_client: int = 200
    workers: int = 1  # processes sharing the listening port (SO_REUSEPORT)
    shutdown_grace: float = 60.0  # seconds in-flight transactions get on SIGTERM
    # connection reuse (``runtime.upstreampool``): an MX connection a session leaves
    # cleanly waits this long for the same client's next session to that destination
    reuse_connections: bool = False
    reuse_idle_timeout: float = 5.0  # seconds unused before it is closed (QUIT)
    reuse_max_age: float = 300.0  # seconds after the dial: not kept any longer
    reuse_max_idle: int = 32  # idle connections kept per (client, destination, source)
    reuse_max_sessions: int = 100  # client sessions one MX connection carries at most
    verbose: bool = False
    relay: RelayConfig = field(default_factory=RelayConfig)
    log_sinks: tuple[str, ...] = ()  # more sinks fed the same records (postgresql:, webhook:, ...)
    plugins: tuple[PluginSpec, ...] = ()  # watching plugins
    filters: tuple[FilterSpec, ...] = ()  # the message filter chain, in order
    filtering: FilteringSettings = field(default_factory=FilteringSettings)
    # fair sharing of a destination between tenants: late binding, the waiting room,
    # learned limits ([fair_sharing], [[destinations]], [[tenants]], [[deferral_rules]])
    fair: FairSettings = field(default_factory=FairSettings)
    # TLS on both legs: client_tls_*, [tls_policy], [[tls_policies]] (``tlsconfig``)
    tls: TlsSettings = field(default_factory=TlsSettings)
    # source addresses: [[source_addresses]], [[source_rules]], source_penalty (``sourceconfig``)
    sources: SourceSettings = field(default_factory=SourceSettings)
    # the destinations' state (``mailsluice destinations``, learned limits kept across
    # restarts); None: ``destinations.json`` beside a file log, else not written
    state_file: str | None = None
    # set by the supervisor: the workers share the broker's scheduler (not a setting)
    shared_fair: bool = False
    # the admin HTTP server (``runtime.admin``: /metrics, /healthz, /readyz); None = off
    admin_listen: HostPort | None = None
    admin_token_file: str | None = None  # a bearer token, read from this file at start
    # names the admin server answers to besides its addresses and localhost (the Host
    # header: DNS rebinding), lower case, no trailing dot (``runtime.admin.guard``)
    admin_allowed_hosts: tuple[str, ...] = ()
    # several gateways, one set of limits (``fleetconfig``, ``runtime.fleet``): the Redis
    # URL (None: this gateway schedules alone), and this gateway's name (None: the host's)
    shared_state: SharedState | None = None
    gateway_name: str | None = None

    @property
    def listen_addresses(self) -> tuple[HostPort, ...]:
        """Every address to listen on, in the order given."""
        return self.listen if isinstance(self.listen, tuple) else (self.listen,)


def parse_host_port(value: str, key: str) -> HostPort:
    """Parse ``host:port`` or ``[v6]:port``."""
    text = value.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]:")
    else:
        host, sep, rest = text.rpartition(":")
    if not sep or not host or not rest.isdigit() or not 0 < int(rest) < 65536:
        raise ConfigError(f"{key}: {value!r} is not HOST:PORT (e.g. 127.0.0.1:10025 or [::1]:25)")
    return HostPort(host, int(rest))


def _listen(raw: object, key: str) -> HostPort | tuple[HostPort, ...]:
    """``"HOST:PORT"``, or a list of them (each address once, in the order given)."""
    if isinstance(raw, str):
        return parse_host_port(raw, key)
    if not isinstance(raw, list):
        raise ConfigError(
            f"{key}: expected a string or a list of strings, got {raw!r} "
            '(e.g. listen = ["0.0.0.0:10025", "[::]:10025"])'
        )
    if not raw:
        raise ConfigError(f"{key}: the list is empty; give at least one HOST:PORT")
    return tuple(dict.fromkeys(parse_host_port(_string(item, key), key) for item in raw))


def _network(value: str, key: str) -> Network:
    expected = (
        f"a network in CIDR form (e.g. 10.0.0.0/8) or {ALLOW_LOCAL!r} (this host's own addresses)"
    )
    return network(value, key, error=ConfigError, expected=expected)


def _allow(raw: list[object], key: str) -> tuple[AllowEntry, ...]:
    """An ``allow`` list: networks, and maybe ``local`` (each entry once)."""
    entries: list[AllowEntry] = []
    for item in raw:
        text = _string(item, key).strip()
        entries.append(ALLOW_LOCAL if text == ALLOW_LOCAL else _network(text, key))
    return tuple(dict.fromkeys(entries))


def _ip(value: str, key: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ConfigError(f"{key}: {value!r} is not an IP address") from None


def _sink_url(value: str, key: str) -> str:
    from mailsluice.sessionlog.codec import parse_log_url

    try:
        parse_log_url(value)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return value


def _shared_state(raw: object, key: str) -> SharedState | None:
    value = _string(raw, key)
    return parse_shared_state(value) if value.strip() else None


def _gateway_name(raw: object, key: str) -> str:
    return parse_gateway_name(_string(raw, key))


def _number(raw: object, key: str, *, minimum: float = 0.0, integer: bool = False) -> float:
    return number(raw, key, minimum=minimum, integer=integer, error=ConfigError)


def _string(raw: object, key: str) -> str:
    if not isinstance(raw, str):
        raise ConfigError(f"{key}: expected a string, got {raw!r}")
    return raw


def _choice(raw: object, key: str, allowed: tuple[str, ...]) -> str:
    text = _string(raw, key)
    if text not in allowed:
        raise ConfigError(f"{key}: {text!r} is not one of {', '.join(allowed)}")
    return text


def _timeouts(table: object, base: Timeouts) -> Timeouts:
    if not isinstance(table, Mapping):
        raise ConfigError("timeouts: expected a table, e.g. [timeouts]")
    known = TABLE_KEYS["timeouts"]  # (hold_max is fair_sharing's: the relay gets it there)
    changes: dict[str, float] = {}
    for key, raw in table.items():
        if key not in known:
            raise ConfigError(
                f"timeouts.{key}: unknown timeout{hint(key, known, 'timeouts')}; known: "
                f"{', '.join(sorted(known))}"
            )
        changes[key] = _number(raw, f"timeouts.{key}", minimum=0.001)
    return replace(base, **changes)


def settings_from_mapping(data: Mapping[str, Any], base: Settings | None = None) -> Settings:
    """Build settings from a parsed TOML document (keys as in ``docs/configuration.md``)."""
    try:
        settings = _settings_from_mapping(data, base or Settings())
    except ConfigError:
        raise
    except SettingsError as exc:  # a part's own (fair sharing's, TLS's...): one class
        raise ConfigError(str(exc)) from None
    if settings.filters:  # filter mode: the relay takes each message whole before the MX
        if not settings.relay.message_size_limit:
            raise ConfigError(
                "message_size_limit: 0 (no limit) cannot be used with filters, since each "
                "message is held whole while they run; set a limit, e.g. 52428800"
            )
        relay = replace(
            settings.relay, filtering=True, filter_keepalive=settings.filtering.keepalive
        )
        settings = replace(settings, relay=relay)
    check_admin(settings)
    return settings


def check_admin(settings: Settings) -> None:
    """``admin_listen`` off a loopback address needs ``admin_token_file`` (never a public
    admin server without a token)."""
    where = settings.admin_listen
    if where is None or settings.admin_token_file:
        return
    try:
        loopback = ipaddress.ip_address(where.host.strip("[]")).is_loopback
    except ValueError:
        loopback = where.host == "localhost"
    if not loopback:
        raise ConfigError(
            f"admin_listen: {where} is not a loopback address; set admin_token_file (a file "
            "holding the bearer token) or listen on 127.0.0.1 / [::1]"
        )


_HOST_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def _allowed_hosts(raw: object, key: str) -> tuple[str, ...]:
    """``admin_allowed_hosts``: DNS names or IP addresses, no scheme, port or wildcard."""
    example = 'e.g. admin_allowed_hosts = ["admin.example.net", "192.0.2.10"]'
    if not isinstance(raw, list):
        raise ConfigError(f"{key}: expected a list of host names, {example}")
    out: list[str] = []
    for item in raw:
        text = item.strip().lower() if isinstance(item, str) else ""
        try:
            out.append(str(ipaddress.ip_address(text.strip("[]"))))
            continue
        except ValueError:
            pass
        name = text.rstrip(".")
        labels = name.split(".")
        if not name or len(name) > 253 or not all(_HOST_LABEL.fullmatch(p) for p in labels):
            raise ConfigError(
                f"{key}: {item!r} is not a host name or an IP address; list the names the "
                f"admin server is reached by (the Host header), without scheme, port or "
                f"wildcard, {example}"
            )
        out.append(name)
    return tuple(dict.fromkeys(out))


def _flag(raw: object, key: str) -> bool:
    if not isinstance(raw, bool):
        raise ConfigError(f"{key}: expected true or false")
    return raw


def _count(minimum: float = 1) -> Callable[[object, str], int]:
    return lambda raw, key: int(_number(raw, key, minimum=minimum, integer=True))


def _seconds(minimum: float) -> Callable[[object, str], float]:
    return lambda raw, key: _number(raw, key, minimum=minimum)


def _host_port_or_none(raw: object, key: str) -> HostPort | None:
    return parse_host_port(_string(raw, key), key) if raw else None


def _allow_list(raw: object, key: str) -> tuple[AllowEntry, ...]:
    if not isinstance(raw, list):
        raise ConfigError("allow: expected a list of networks, e.g. ['local', '10.0.0.0/8']")
    return _allow(raw, key)


def _sinks(raw: object, key: str) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise ConfigError("log_sinks: expected a list of log URLs")
    return tuple(_sink_url(_string(url, key), key) for url in raw)


#: the top-level keys that are ``Settings`` fields of the same name, and how each is read
_TOP: dict[str, Callable[[object, str], Any]] = {
    "listen": _listen,
    "upstream": _host_port_or_none,
    "outbound_ip": lambda raw, key: _ip(_string(raw, key), key) if raw else None,
    "allow": _allow_list,
    "log": lambda raw, key: _sink_url(_string(raw, key), key),
    "state_file": lambda raw, key: _string(raw, key) or None,
    "admin_listen": _host_port_or_none,
    "admin_token_file": lambda raw, key: _string(raw, key) or None,
    "admin_allowed_hosts": _allowed_hosts,
    "shared_state": _shared_state,
    "gateway_name": _gateway_name,
    "log_queue_limit": _count(),
    "workers": _count(),
    "max_connections": _count(),
    "max_connections_per_client": _count(minimum=0),
    "shutdown_grace": _seconds(0),
    "reuse_connections": _flag,
    "reuse_idle_timeout": _seconds(0.001),
    "reuse_max_age": _seconds(0.001),
    "reuse_max_idle": _count(),
    "reuse_max_sessions": _count(),
    "log_process": _flag,
    "verbose": _flag,
    "log_sinks": _sinks,
    "filtering": lambda raw, key: parse_filtering(raw),
    "filters": lambda raw, key: parse_filters(raw),
    "plugins": lambda raw, key: parse_plugins(raw),
}

#: the top-level keys that are the relay's (``RelayConfig`` fields of the same name)
_RELAY: dict[str, Callable[[object, str], Any]] = {
    "message_size_limit": _count(minimum=0),
    "max_recipients": _count(),
    "bare_newline": lambda raw, key: BareNewlinePolicy(
        _choice(raw, key, tuple(p.value for p in BareNewlinePolicy))
    ),
    "tls": lambda raw, key: TlsMode(_choice(raw, key, tuple(m.value for m in TlsMode))),
    "log_headers": _flag,
    "xverp": _flag,
    "hostname": _string,
}


def _settings_from_mapping(data: Mapping[str, Any], settings: Settings) -> Settings:
    relay = settings.relay
    top: dict[str, Any] = {}
    fair_keys = ("fair_sharing", "destinations", "tenants", "deferral_rules")
    if any(key in data for key in fair_keys):
        table = data.get("fair_sharing")
        if table is not None and not isinstance(table, Mapping):
            raise ConfigError("fair_sharing: expected a table, e.g. [fair_sharing]")
        top["fair"] = parse_fair(table, *(data.get(k) for k in fair_keys[1:]))
    tls_keys = (*CLIENT_KEYS, "tls_policy", "tls_policies")
    if any(key in data for key in tls_keys):
        client = {key: data[key] for key in CLIENT_KEYS if key in data}
        top["tls"] = parse_tls(client, data.get("tls_policy"), data.get("tls_policies"))
    source_keys = ("source_addresses", "source_rules", "source_penalty")
    if any(key in data for key in source_keys):
        top["sources"] = parse_sources(*(data.get(k) for k in source_keys))
        fair = top.get("fair", settings.fair)
        tenants = tuple(group.name for group in fair.tenants)
        check_sources(top["sources"], fair_sharing=fair.enabled, tenants=tenants)
    for key, raw in data.items():
        if key in tls_keys or key in source_keys or key in fair_keys:
            continue  # read above, together
        if key in _TOP:
            top[key] = _TOP[key](raw, key)
        elif key in _RELAY:
            relay = replace(relay, **{key: _RELAY[key](raw, key)})
        elif key == "timeouts":
            relay = replace(relay, timeouts=_timeouts(raw, relay.timeouts))
        else:
            raise ConfigError(
                f"{key}: unknown setting{hint(key, TOP_KEYS)} (see docs/configuration.md)"
            )
    return replace(settings, relay=relay, **top)


def load_file(path: Path, base: Settings | None = None) -> Settings:
    """Read and validate a TOML configuration file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file ({exc.strerror})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return settings_from_mapping(data, base)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
