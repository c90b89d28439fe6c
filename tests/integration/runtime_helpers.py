"""Shared helpers of the runtime tests."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from mailsluice.settings.config import HostPort, Settings

LOOPBACK = "127.0.0.1"


def runtime_settings(upstream: tuple[str, int] | None, tmp_path: Path, **top: Any) -> Settings:
    settings = Settings(
        listen=HostPort(LOOPBACK, 0),
        upstream=HostPort(*upstream) if upstream else None,
        log=f"sqlite:{tmp_path / 'sessions.db'}",
    )
    return replace(settings, **top)
