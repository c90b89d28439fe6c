"""Configuration of filters, plugins and extra log sinks (pure values and their parsing).

The TOML shape (``docs/plugins.md`` has the full reference)::

    log_sinks = ["postgresql://mailsluice@db/mail", "webhook:https://hooks.example/T1?events=reject"]

    [filtering]             # applies when [[filters]] has entries
    timeout = 60            # seconds for each filter (the whole chain: at most 300)
    on_failure = "tempfail" # a filter that fails: "tempfail" (451 4.3.0) or "reject" (554 5.3.0)
    memory_limit = 1048576  # bytes of a message kept in memory before it goes to a spool file
    spool_dir = ""          # where spool files go ("" = the system's temporary directory)
    keepalive = 60          # NOOP to the idle MX this often while we wait

    [[filters]]             # run in this order
    type = "trace-header"   # trace-header | patterns | rate-limit | milter | plugin
    header = "X-Mailsluice-Id"

    [[plugins]]             # watchers: session, line, transaction and session-end hooks
    use = "mypackage.hooks:plugin"   # module:attribute, or an entry-point name
    timeout = 5             # seconds per hook call

Everything except ``type``/``use``/``timeout`` in a ``[[filters]]`` or ``[[plugins]]``
table is that filter's or plugin's own options.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mailsluice.settings.keyhints import TABLE_KEYS, hint
from mailsluice.settings.values import SettingsError, number

__all__ = [
    "FILTER_TYPES",
    "FilterSpec",
    "FilteringSettings",
    "PluginConfigError",
    "PluginSpec",
    "parse_filtering",
    "parse_filters",
    "parse_plugins",
]

# The client waits for the reply to its end-of-data (RFC 5321 §4.5.3.2.6: 10 minutes);
# the filters, the DATA to the MX and its reply must fit in that budget.
MAX_FILTER_TIMEOUT = 300.0
FILTER_TYPES = ("trace-header", "patterns", "rate-limit", "milter", "plugin")
FAILURE_POLICIES = {"tempfail": (451, "4.3.0 Error: message filter unavailable, try again later"),
                    "reject": (554, "5.3.0 Error: message filter failed")}  # fmt: skip


class PluginConfigError(SettingsError):
    """A filter or plugin setting is wrong; the message names the key and the fix."""


def _frozen(options: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(options))


@dataclass(frozen=True, slots=True)
class FilterSpec:
    type: str
    options: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))
    timeout: float | None = None  # this filter's own limit (milter); None = the chain's

    @property
    def label(self) -> str:
        use = self.options.get("use") or self.options.get("address")
        return f"{self.type}({use})" if use else self.type


@dataclass(frozen=True, slots=True)
class PluginSpec:
    use: str  # "module:attribute" or an entry-point name
    options: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))
    timeout: float = 5.0  # per hook call


@dataclass(frozen=True, slots=True, kw_only=True)
class FilteringSettings:
    timeout: float = 60.0
    on_failure: str = "tempfail"
    memory_limit: int = 1 << 20
    spool_dir: str = ""
    keepalive: float = 60.0

    @property
    def failure_reply(self) -> tuple[int, str]:
        return FAILURE_POLICIES[self.on_failure]


def _number(raw: object, key: str, minimum: float) -> float:
    return float(number(raw, key, minimum=minimum, error=PluginConfigError))


def parse_filtering(table: object) -> FilteringSettings:
    if not isinstance(table, Mapping):
        raise PluginConfigError("filtering: expected a table, e.g. [filtering]")
    base = FilteringSettings()
    values: dict[str, Any] = {}
    for key, raw in table.items():
        name = f"filtering.{key}"
        if key in ("timeout", "keepalive"):
            values[key] = _number(raw, name, 0.001)
            if key == "timeout" and values[key] > MAX_FILTER_TIMEOUT:
                raise PluginConfigError(
                    f"{name}: {raw} s is longer than a sending MTA waits for the reply to "
                    f"its end-of-data (RFC 5321: 10 minutes; ours must end well before): use "
                    f"at most {MAX_FILTER_TIMEOUT:g}"
                )
        elif key == "memory_limit":
            values[key] = int(_number(raw, name, 0))
        elif key == "on_failure":
            if raw not in FAILURE_POLICIES:
                raise PluginConfigError(
                    f"{name}: {raw!r} is not one of {', '.join(FAILURE_POLICIES)}"
                )
            values[key] = raw
        elif key == "spool_dir":
            if not isinstance(raw, str):
                raise PluginConfigError(f"{name}: expected a directory path (a string)")
            values[key] = raw
        else:
            said = hint(key, TABLE_KEYS["filtering"], "filtering")
            raise PluginConfigError(
                f"{name}: unknown setting{said}; known: timeout, on_failure, memory_limit, "
                "spool_dir, keepalive"
            )
    return FilteringSettings(**{**_fields(base), **values})


def _fields(settings: FilteringSettings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in FilteringSettings.__slots__}


def _tables(raw: object, key: str) -> list[Mapping[str, Any]]:
    if not isinstance(raw, list) or not all(isinstance(t, Mapping) for t in raw):
        raise PluginConfigError(f"{key}: expected an array of tables, e.g. [[{key}]]")
    return list(raw)


def parse_filters(raw: object) -> tuple[FilterSpec, ...]:
    specs: list[FilterSpec] = []
    for index, table in enumerate(_tables(raw, "filters")):
        where = f"filters[{index}]"
        kind = table.get("type")
        if kind not in FILTER_TYPES:
            raise PluginConfigError(
                f"{where}.type: {kind!r} is not a filter type; use one of {', '.join(FILTER_TYPES)}"
            )
        if kind == "plugin" and not isinstance(table.get("use"), str):
            raise PluginConfigError(f'{where}.use: a plugin filter needs use = "module:attribute"')
        if kind == "milter" and not isinstance(table.get("address"), str):
            raise PluginConfigError(
                f"{where}.address: a milter needs its address, "
                'e.g. address = "inet:127.0.0.1:11332"'
            )
        timeout = table.get("timeout")
        options = {k: v for k, v in table.items() if k not in ("type", "timeout")}
        specs.append(
            FilterSpec(
                type=str(kind),
                options=_frozen(options),
                timeout=None if timeout is None else _number(timeout, f"{where}.timeout", 0.001),
            )
        )
    return tuple(specs)


def parse_plugins(raw: object) -> tuple[PluginSpec, ...]:
    specs: list[PluginSpec] = []
    for index, table in enumerate(_tables(raw, "plugins")):
        where = f"plugins[{index}]"
        use = table.get("use")
        if not isinstance(use, str) or not use:
            raise PluginConfigError(
                f'{where}.use: name the plugin, e.g. use = "mypackage.hooks:plugin"'
            )
        timeout = _number(table.get("timeout", 5.0), f"{where}.timeout", 0.001)
        options = {k: v for k, v in table.items() if k not in ("use", "timeout")}
        specs.append(PluginSpec(use=use, options=_frozen(options), timeout=timeout))
    return tuple(specs)
