"""``listen``: one address or several (issue 12, defect 2), in the file and as flags."""

from __future__ import annotations

import pytest

from mailsluice.settings.config import (
    ConfigError,
    HostPort,
    Settings,
    settings_from_mapping,
)

pytestmark = pytest.mark.unit


def test_the_default_is_one_loopback_address() -> None:
    assert Settings().listen_addresses == (HostPort("127.0.0.1", 10025),)


def test_a_single_string_is_still_accepted() -> None:
    settings = settings_from_mapping({"listen": "0.0.0.0:10025"})
    assert settings.listen_addresses == (HostPort("0.0.0.0", 10025),)


def test_the_same_address_twice_is_listed_once() -> None:
    settings = settings_from_mapping({"listen": ["[::]:25", "[::]:25", "0.0.0.0:25"]})
    assert settings.listen_addresses == (HostPort("::", 25), HostPort("0.0.0.0", 25))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "listen: the list is empty; give at least one HOST:PORT"),
        (["0.0.0.0:25", 25], "listen: expected a string, got 25"),
        (["0.0.0.0:25", "nowhere"], "listen: 'nowhere' is not HOST:PORT"),
        (25, "listen: expected a string or a list of strings, got 25"),
    ],
)
def test_wrong_values_name_the_key(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping({"listen": value})
    assert str(caught.value).startswith(message)
