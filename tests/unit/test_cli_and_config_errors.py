"""The command line and the configuration file: type errors name the key, options reach the
settings, pass-through to the lab's commands, Ctrl-C."""

from __future__ import annotations

import logging

import pytest

from mailsluice.cli.main import build_parser, main, settings_from_args
from mailsluice.settings.config import ConfigError, settings_from_mapping

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"listen": 10025},
            "listen: expected a string or a list of strings, got 10025 "
            '(e.g. listen = ["0.0.0.0:10025", "[::]:10025"])',
        ),
        ({"timeouts": 30}, "timeouts: expected a table, e.g. [timeouts]"),
        ({"log_queue_limit": 0}, "log_queue_limit: expected a whole number of at least 1, got 0"),
        (
            {"log_queue_limit": 2.5},
            "log_queue_limit: expected a whole number of at least 1, got 2.5",
        ),
        ({"log_process": "yes"}, "log_process: expected true or false"),
        ({"log_headers": 1}, "log_headers: expected true or false"),
    ],
)
def test_wrong_types_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        settings_from_mapping(data)
    assert str(error.value) == message


def test_log_settings_are_read() -> None:
    settings = settings_from_mapping(
        {"log_queue_limit": 7, "log_process": False, "log_headers": True}
    )
    assert (settings.log_queue_limit, settings.log_process) == (7, False)
    assert settings.relay.log_headers is True


def test_verbose_flag_reaches_the_settings() -> None:
    args = build_parser().parse_args(["serve", "-v", "--log", "none:"])
    assert settings_from_args(args).verbose is True
    quiet = build_parser().parse_args(["serve", "--log", "none:"])
    assert settings_from_args(quiet).verbose is False


def test_ctrl_c_while_serving_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    import mailsluice.runtime.launch as launch

    def interrupted(settings: object, source: object = None) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "run", interrupted)
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: None)  # keep pytest's
    assert main(["serve", "--log", "none:", "--upstream", "127.0.0.1:9"]) == 130
