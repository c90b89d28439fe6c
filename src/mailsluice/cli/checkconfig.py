"""``mailsluice check-config``: is this file one ``serve`` would start with?

It reads the file as ``serve --config FILE`` does, loads every filter and plugin (nothing
is connected to), checks the client leg's certificate, and runs the same start checks as
``serve`` (``runtime.startup.check``): ``outbound_ip`` and ``[[source_addresses]]`` are
addresses of this host, an ``upstream`` name resolves, ``admin_token_file`` can be read,
the directories of ``log``, ``log_sinks`` and ``state_file`` exist. ``--no-host-checks``
skips those that ask this host (its addresses, its resolver, its files), for a file
checked on another machine than the one that will run it. Not checked: whether the
``listen`` ports are free (the running service holds them while a new file is checked).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from mailsluice.plugins.build import BuildError
from mailsluice.settings.config import ConfigError, load_file
from mailsluice.settings.logplace import DEFAULT_LOG

__all__ = ["check_config"]


def check_config(path: Path, *, host: bool = True, out: TextIO | None = None) -> int:
    """Check ``path``; ``ConfigError`` (naming the file) when ``serve`` would refuse it."""
    out = out or sys.stdout
    settings = load_file(path)
    from mailsluice.plugins.build import build_filter_chain, build_watchers
    from mailsluice.runtime import startup
    from mailsluice.runtime.tls import client as clienttls

    try:
        chain = build_filter_chain(settings)  # every plugin and filter loaded
        watchers = build_watchers(settings)
        client_tls = clienttls.check(settings) if host else "client TLS not checked"
        warnings = startup.check(settings, host=host)
    except (ConfigError, BuildError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    for warning in warnings:
        print(f"mailsluice check-config: {path}: warning: {warning}", file=sys.stderr)
    mode = f"upstream {settings.upstream}" if settings.upstream else "transparent"
    extras = "".join(
        f", {label}"
        for label, present in (
            (f"filters: {', '.join(chain.names)}" if chain else "", chain is not None),
            (f"{len(watchers)} watching plugin(s)", bool(watchers)),
            (f"{len(settings.log_sinks)} extra log sink(s)", bool(settings.log_sinks)),
            (client_tls, True),
            ("this host not checked (--no-host-checks)", not host),
        )
        if present
    )
    listen = ", ".join(map(str, settings.listen_addresses))
    log = settings.log or f"{DEFAULT_LOG} (the default)"
    print(f"{path}: OK (listen {listen}, {mode}, log {log}{extras})", file=out)
    return 0
