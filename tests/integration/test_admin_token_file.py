"""``admin_token_file``: the file must hold one token (read as the admin server reads it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailsluice.runtime.admin.host import read_token
from mailsluice.settings.config import (
    ConfigError,
    HostPort,
    Settings,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_token_file_must_hold_one_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc123\n")
    settings = Settings(admin_listen=HostPort("0.0.0.0", 1), admin_token_file=str(path))
    assert read_token(settings) == "abc123"
    path.write_text("\n")
    with pytest.raises(ConfigError, match=r"admin_token_file: .* must hold one token"):
        read_token(settings)
    with pytest.raises(ConfigError, match="admin_token_file: cannot read"):
        read_token(
            Settings(admin_listen=HostPort("127.0.0.1", 1), admin_token_file=str(tmp_path / "none"))
        )
