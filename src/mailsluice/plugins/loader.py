"""Finding plugins: ``module:attribute`` or an entry point of ``mailsluice.plugins``.

The named object is used as it is when it already looks like a plugin (it has a
``name`` and at least one hook or ``filter``); a class or a function is called with
the plugin's options (a ``dict``) to make one. Every failure is a
:class:`PluginLoadError` saying what was looked for and how to fix it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from mailsluice.plugins.api import ENTRY_POINT_GROUP, HOOKS

__all__ = ["PluginLoadError", "has_filter", "hooks_of", "load_plugin"]


class PluginLoadError(ValueError):
    """A plugin cannot be loaded; the message names it and the fix."""


def _resolve(use: str) -> Any:
    if ":" in use:
        module_name, _, attribute = use.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise PluginLoadError(
                f"plugin {use!r}: cannot import module {module_name!r} "
                f"({type(exc).__name__}: {exc}); is the package installed in this Python?"
            ) from None
        target: Any = module
        for part in attribute.split("."):
            try:
                target = getattr(target, part)
            except AttributeError:
                raise PluginLoadError(
                    f"plugin {use!r}: module {module_name!r} has no attribute {attribute!r}"
                ) from None
        return target
    from importlib.metadata import entry_points  # (only for a plugin named by its entry point)

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == use]
    if not found:
        known = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        listing = ", ".join(known) if known else "none installed"
        raise PluginLoadError(
            f"plugin {use!r}: no entry point of that name in group {ENTRY_POINT_GROUP!r} "
            f"({listing}); write module:attribute or install the plugin's package"
        )
    try:
        return found[0].load()
    except Exception as exc:
        raise PluginLoadError(
            f"plugin {use!r}: its entry point failed to load ({type(exc).__name__}: {exc})"
        ) from None


def hooks_of(plugin: object) -> tuple[str, ...]:
    """The watching hooks the plugin implements (not the do-nothing base ones)."""
    from mailsluice.plugins.api import Plugin

    out = []
    for hook in HOOKS:
        method = getattr(plugin, hook, None)
        if not callable(method):
            continue
        base = getattr(Plugin, hook)
        if getattr(method, "__func__", None) is base:
            continue
        out.append(hook)
    return tuple(out)


def has_filter(plugin: object) -> bool:
    return callable(getattr(plugin, "filter", None))


def _looks_like_plugin(target: object) -> bool:
    if inspect.isclass(target) or inspect.isfunction(target):
        return False
    return bool(hooks_of(target)) or has_filter(target)


def load_plugin(use: str, options: Mapping[str, Any] | None = None) -> object:
    """Load the plugin ``use`` names; a factory gets ``options`` as a dict."""
    target = _resolve(use)
    if not _looks_like_plugin(target):
        if not callable(target):
            raise PluginLoadError(
                f"plugin {use!r}: {type(target).__name__} is neither a plugin (no hooks, no "
                "filter method) nor a factory that makes one"
            )
        try:
            target = target(dict(options or {}))
        except Exception as exc:
            raise PluginLoadError(
                f"plugin {use!r}: its factory failed with the given options "
                f"({type(exc).__name__}: {exc}); check the plugin's options"
            ) from None
        if not _looks_like_plugin(target):
            raise PluginLoadError(
                f"plugin {use!r}: the factory returned {type(target).__name__}, which has no "
                f"hook ({', '.join(HOOKS)}) and no filter method"
            )
    elif options:
        raise PluginLoadError(
            f"plugin {use!r} is an object, not a factory: it takes no options "
            f"(remove {', '.join(sorted(options))} or point use at a factory)"
        )
    if not isinstance(getattr(target, "name", None), str):
        try:
            target.name = use.rpartition(":")[2] or use
        except AttributeError:
            raise PluginLoadError(f"plugin {use!r}: give it a name attribute (a string)") from None
    return target
