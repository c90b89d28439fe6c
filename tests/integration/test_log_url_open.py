"""Opening the session log's backends from their URLs: the file schemes open their files, and a
missing CA file is named before any connection. The URLs themselves: tests/unit/test_log_url.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mailsluice.sessionlog.backends import open_backend
from mailsluice.sessionlog.codec import (
    SessionLogError,
)
from mailsluice.sessionlog.interfaces import NullBackend
from mailsluice.sessionlog.jsonl.writer import JsonlBackend
from mailsluice.sessionlog.sqlite.writer import SqliteBackend
from mailsluice.sessionlog.webhook import WebhookBackend

pytestmark = pytest.mark.integration


def test_open_backend_covers_the_file_schemes(tmp_path: Path) -> None:
    sqlite = open_backend(f"sqlite:{tmp_path}/log.db")
    assert isinstance(sqlite, SqliteBackend)
    sqlite.close()
    jsonl = open_backend(f"jsonl:{tmp_path}/log.jsonl?max_bytes=8192&keep=2")
    assert isinstance(jsonl, JsonlBackend)
    assert (jsonl.max_bytes, jsonl.keep) == (8192, 2)
    jsonl.close()
    assert isinstance(open_backend("none:"), NullBackend)
    hook = open_backend("webhook:http://127.0.0.1:9/x?events=session&retries=0")
    assert isinstance(hook, WebhookBackend)
    assert (hook.retries, hook.shown) == (0, "http://127.0.0.1:9/***")
    with pytest.raises(SessionLogError, match="does not exist"):
        open_backend(f"jsonl:{tmp_path}/missing/log.jsonl")
    with pytest.raises(SessionLogError, match="unknown scheme"):
        open_backend("ftp:x")


def test_a_missing_ca_file_is_named_before_any_connection(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(SessionLogError, match=rf"cannot read the CA file {missing} .*ssl_ca="):
        open_backend(f"mysql://u:Secret-Pw@127.0.0.1:9/db?ssl_ca={missing}")
