"""Turning the configuration into running objects: the filter chain and the log sinks.

Called once per worker at start (and by ``check-config``, so a bad plugin or milter
address is reported before the proxy runs). Every failure is a :class:`BuildError`
naming the ``[[filters]]``/``[[plugins]]`` entry and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mailsluice.filtering.api import MessageFilter, Reject
from mailsluice.filtering.builtin import PatternPolicy, SenderRateLimit, TraceHeader
from mailsluice.filtering.chain import FilterChain
from mailsluice.plugins.loader import PluginLoadError, has_filter, hooks_of, load_plugin
from mailsluice.settings.filters import FilterSpec

if TYPE_CHECKING:
    from mailsluice.settings.config import Settings

__all__ = ["BuildError", "build_filter", "build_filter_chain", "build_watchers"]


class BuildError(ValueError):
    """A filter or plugin cannot be set up; the message names the entry and the fix."""


def build_filter(spec: FilterSpec, default_timeout: float) -> MessageFilter:
    options: Mapping[str, Any] = spec.options
    if spec.type == "trace-header":
        return TraceHeader.from_options(options)
    if spec.type == "patterns":
        return PatternPolicy.from_options(options)
    if spec.type == "rate-limit":
        return SenderRateLimit.from_options(options)
    if spec.type == "milter":
        from mailsluice.milter.filter import MilterFilter

        rest = {k: v for k, v in options.items() if k != "address"}
        return MilterFilter.from_url(
            str(options["address"]), timeout=spec.timeout or default_timeout, **rest
        )
    use = str(options["use"])
    plugin = load_plugin(use, {k: v for k, v in options.items() if k not in ("use", "name")})
    if not has_filter(plugin):
        raise BuildError(f"plugin {use!r} has no filter(message) method; list it under [[plugins]]")
    if isinstance(options.get("name"), str):
        plugin.name = options["name"]  # type: ignore[attr-defined]
    assert isinstance(plugin, MessageFilter)
    return plugin


def build_filter_chain(settings: Settings) -> FilterChain | None:
    """The chain of ``[[filters]]``, or None when there are none."""
    if not settings.filters:
        return None
    filtering = settings.filtering
    filters: list[MessageFilter] = []
    seen: dict[str, int] = {}
    for index, spec in enumerate(settings.filters):
        try:
            flt = build_filter(spec, filtering.timeout)
        except (ValueError, TypeError, PluginLoadError) as exc:
            raise BuildError(f"filters[{index}] ({spec.label}): {exc}") from None
        seen[flt.name] = seen.get(flt.name, 0) + 1
        if seen[flt.name] > 1:  # two of a kind: keep names unique for logs and counters
            try:
                flt.name = f"{flt.name}#{seen[flt.name]}"
            except AttributeError:
                raise BuildError(
                    f"filters[{index}]: another filter is already named {flt.name!r}; "
                    'give this one a name = "..."'
                ) from None
        filters.append(flt)
    code, text = filtering.failure_reply
    try:
        return FilterChain(filters, timeout=filtering.timeout, failure=Reject(code, text))
    except ValueError as exc:
        raise BuildError(f"filters: {exc}") from None


def build_watchers(settings: Settings) -> list[tuple[object, float]]:
    """The ``[[plugins]]`` objects with their hook timeouts."""
    out: list[tuple[object, float]] = []
    for index, spec in enumerate(settings.plugins):
        try:
            plugin = load_plugin(spec.use, spec.options)
        except PluginLoadError as exc:
            raise BuildError(f"plugins[{index}]: {exc}") from None
        if not hooks_of(plugin):
            raise BuildError(
                f"plugins[{index}] ({spec.use}): no watching hook (session_started, line, "
                "transaction_ended, session_ended); a filter goes under [[filters]] "
                'with type = "plugin"'
            )
        out.append((plugin, spec.timeout))
    return out
