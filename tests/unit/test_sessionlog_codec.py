"""The session log's codec: URLs, times and records as JSON."""

from __future__ import annotations

import pytest
from tests.support.log_session import T0

from mailsluice import native
from mailsluice.sessionlog.codec import iso_utc, parse_log_url, record_to_json

pytestmark = pytest.mark.unit


def test_codec_edges() -> None:
    url = parse_log_url("sqlite:/var/lib/mailsluice/log.db")
    assert str(url) == "sqlite:/var/lib/mailsluice/log.db"
    # compiled by mypyc, the codec checks the argument's type at the call (its own message)
    refused = "tuple object expected" if native.build() == "compiled" else "not a session log"
    with pytest.raises(TypeError, match=refused):
        record_to_json("a string")  # type: ignore[arg-type]
    assert iso_utc(1e20) is None  # far beyond any calendar
    assert iso_utc(float("nan")) is None
    assert iso_utc(T0) == "2024-05-01T12:00:00.000Z"
