"""``listen``: one address or several (issue 12, defect 2), in the file and as flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from mailsluice.cli.main import build_parser, settings_from_args
from mailsluice.settings.config import (
    ConfigError,
    HostPort,
    Settings,
    load_file,
    settings_from_mapping,
)

pytestmark = pytest.mark.unit


def test_the_default_is_one_loopback_address() -> None:
    assert Settings().listen_addresses == (HostPort("127.0.0.1", 10025),)


def test_a_single_string_is_still_accepted() -> None:
    settings = settings_from_mapping({"listen": "0.0.0.0:10025"})
    assert settings.listen_addresses == (HostPort("0.0.0.0", 10025),)


def test_a_list_in_the_file_listens_on_every_address(tmp_path: Path) -> None:
    path = tmp_path / "mailsluice.toml"
    path.write_text('listen = ["0.0.0.0:10025", "[::]:10025"]\n')
    assert load_file(path).listen_addresses == (
        HostPort("0.0.0.0", 10025),
        HostPort("::", 10025),
    )


def test_the_flag_is_repeatable_and_wins_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mailsluice.toml"
    path.write_text('listen = ["0.0.0.0:10025", "[::]:10025"]\n')
    argv = ["serve", "--config", str(path), "--listen", "127.0.0.1:2525",
            "--listen", "[::1]:2525", "--workers", "3"]  # fmt: skip
    settings = settings_from_args(build_parser().parse_args(argv))
    assert settings.listen_addresses == (HostPort("127.0.0.1", 2525), HostPort("::1", 2525))
    assert settings.workers == 3


def test_one_flag_replaces_the_files_list(tmp_path: Path) -> None:
    path = tmp_path / "mailsluice.toml"
    path.write_text('listen = ["0.0.0.0:10025", "[::]:10025"]\n')
    argv = ["serve", "--config", str(path), "--listen", "127.0.0.1:2525"]
    settings = settings_from_args(build_parser().parse_args(argv))
    assert settings.listen_addresses == (HostPort("127.0.0.1", 2525),)


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
