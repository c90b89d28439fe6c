"""``shared_state`` and ``gateway_name`` (issue 26): the forms accepted, the errors."""

from __future__ import annotations

import pytest

from mailsluice.settings.config import ConfigError, settings_from_mapping
from mailsluice.settings.fleet import parse_shared_state

pytestmark = pytest.mark.unit


def test_without_shared_state_nothing_is_set() -> None:
    settings = settings_from_mapping({})
    assert settings.shared_state is None
    assert settings.gateway_name is None


@pytest.mark.parametrize(
    ("url", "hosts", "db", "tls", "service"),
    [
        ("redis://10.0.0.5:6379/0", (("10.0.0.5", 6379),), 0, False, None),
        ("redis://10.0.0.5", (("10.0.0.5", 6379),), 0, False, None),
        ("rediss://:s3cret@redis.example:6380/2", (("redis.example", 6380),), 2, True, None),
        ("redis://[2001:db8::5]:7000/1", (("2001:db8::5", 7000),), 1, False, None),
        ("redis+sentinel://a:26379,b/mailsluice/3", (("a", 26379), ("b", 26379)), 3, False,
         "mailsluice"),
    ],
)  # fmt: skip
def test_the_forms(
    url: str, hosts: tuple[tuple[str, int], ...], db: int, tls: bool, service: str | None
) -> None:
    state = settings_from_mapping({"shared_state": url}).shared_state
    assert state is not None
    assert (state.hosts, state.db, state.tls, state.service) == (hosts, db, tls, service)


def test_the_password_is_never_shown() -> None:
    state = parse_shared_state("redis://:s3cret@10.0.0.5:6379/0?password_file=/etc/x")
    assert state.password == "s3cret"
    assert state.password_file == "/etc/x"
    assert "s3cret" not in repr(state)
    assert "s3cret" not in state.shown


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"shared_state": "http://10.0.0.5"}, "the scheme must be redis://, rediss:// or"),
        ({"shared_state": "redis://a:1,b:2/0"}, "several hosts need redis+sentinel://"),
        ({"shared_state": "redis+sentinel://a:26379"}, "name the master after the Sentinels"),
        ({"shared_state": "redis://a:1/zero"}, "the database is a number"),
        ({"shared_state": "redis://a:99999"}, "is not HOST:PORT"),
        ({"shared_state": "redis://a:1/0?timeout=3"}, "unknown option 'timeout'"),
        ({"gateway_name": "gw a"}, "gateway_name: 'gw a': 1 to 64 letters"),
        ({"shared_stat": "redis://a"}, "did you mean 'shared_state'"),
    ],
)
def test_errors_name_the_key_and_the_fix(raw: dict[str, str], said: str) -> None:
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace("+", r"\+")):
        settings_from_mapping(raw)
