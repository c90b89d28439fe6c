"""Configuration files: every key read from a file, flags over the file (``--config``),
``check-config`` on files, listen lists and ``allow = ["local"]`` in a file. The rules of the
keys are unit-tested from text (``tests/unit/test_config.py``).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from mailsluice.cli.main import build_parser, main, settings_from_args
from mailsluice.relay.config import BareNewlinePolicy, TlsMode
from mailsluice.settings.config import ConfigError, HostPort, Settings, load_file

pytestmark = pytest.mark.integration

FULL = """
listen = "0.0.0.0:2525"
upstream = "10.1.2.3:25"
outbound_ip = "192.0.2.10"
allow = ["10.0.0.0/8"]
log = "jsonl:/tmp/x.jsonl"
message_size_limit = 5000
max_recipients = 50
max_connections = 10
max_connections_per_client = 4
workers = 2
bare_newline = "normalize"
tls = "off"
hostname = "gw.example"
log_headers = true
xverp = false
shutdown_grace = 5
verbose = true

[timeouts]
connect = 3
data_done = 60.5
"""


def test_every_key_is_read(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(FULL)
    s = load_file(path)
    assert s.listen == HostPort("0.0.0.0", 2525)
    assert s.upstream == HostPort("10.1.2.3", 25)
    assert s.outbound_ip == "192.0.2.10"
    assert s.allow == (ipaddress.ip_network("10.0.0.0/8"),)
    assert s.log == "jsonl:/tmp/x.jsonl"
    assert (s.max_connections, s.workers, s.shutdown_grace, s.verbose) == (10, 2, 5, True)
    assert s.max_connections_per_client == 4
    assert s.relay.message_size_limit == 5000
    assert s.relay.max_recipients == 50
    assert s.relay.bare_newline is BareNewlinePolicy.NORMALIZE
    assert s.relay.tls is TlsMode.OFF
    assert s.relay.hostname == "gw.example"
    assert s.relay.log_headers is True
    assert s.relay.xverp is False
    assert s.relay.timeouts.connect == 3
    assert s.relay.timeouts.data_done == 60.5
    assert s.relay.timeouts.greeting == 240  # untouched keys keep their defaults


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(FULL)
    args = build_parser().parse_args(
        ["serve", "--config", str(path), "--listen", "127.0.0.1:1", "--allow", "::1/128",
         "--message-size-limit", "7", "--workers", "3", "--max-connections-per-client", "0"]
    )  # fmt: skip
    s = settings_from_args(args)
    assert s.max_connections_per_client == 0  # over the file's 4: 0 = no per-client cap
    assert s.listen == HostPort("127.0.0.1", 1)
    assert s.allow == (ipaddress.ip_network("::1/128"),)
    assert s.relay.message_size_limit == 7
    assert s.workers == 3
    assert s.upstream == HostPort("10.1.2.3", 25)  # from the file


def test_check_config_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.toml"
    good.write_text(FULL)
    # (its outbound_ip is not this host's: the file is checked as for another machine)
    assert main(["check-config", "--no-host-checks", str(good)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text("workers = 0")
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "workers" in err
    assert "at least 1" in err
    assert main(["check-config", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_check_config_validates_the_per_client_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "caps.toml"
    path.write_text("max_connections = 500\nmax_connections_per_client = 0\n")
    assert main(["check-config", str(path)]) == 0
    path.write_text("max_connections_per_client = -1\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "max_connections_per_client" in err
    assert "at least 0" in err


def test_connection_reuse_keys_and_flag(tmp_path: Path) -> None:
    assert Settings().reuse_connections is False  # off unless asked for
    path = tmp_path / "reuse.toml"
    path.write_text(
        "reuse_connections = true\nreuse_idle_timeout = 2.5\nreuse_max_age = 60\n"
        "reuse_max_idle = 4\nreuse_max_sessions = 10\n"
    )
    s = load_file(path)
    assert s.reuse_connections is True
    assert (s.reuse_idle_timeout, s.reuse_max_age) == (2.5, 60)
    assert (s.reuse_max_idle, s.reuse_max_sessions) == (4, 10)
    flags = settings_from_args(build_parser().parse_args(["serve", "--reuse-connections"]))
    assert flags.reuse_connections is True
    assert settings_from_args(build_parser().parse_args(["serve"])).reuse_connections is False


def test_no_fair_sharing_flag_turns_it_off_and_keeps_the_files_settings(tmp_path: Path) -> None:
    config = tmp_path / "m.toml"
    config.write_text("[fair_sharing]\nhold_max = 30\n")
    on = settings_from_args(build_parser().parse_args(["serve", "--config", str(config)]))
    assert (on.fair.enabled, on.fair.hold_max) == (True, 30.0)
    argv = ["serve", "--config", str(config), "--no-fair-sharing", "--workers", "2"]
    off = settings_from_args(build_parser().parse_args(argv))
    assert (off.fair.enabled, off.fair.hold_max, off.workers) == (False, 30.0, 2)


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


def test_local_in_the_file_and_as_a_flag(tmp_path: Path) -> None:
    path = tmp_path / "mailsluice.toml"
    path.write_text('allow = ["local", "10.0.0.0/8"]\n')
    assert load_file(path).allow == ("local", ipaddress.ip_network("10.0.0.0/8"))
    args = build_parser().parse_args(["serve", "--allow", "local"])
    assert settings_from_args(args).allow == ("local",)


def test_a_file_that_is_not_toml_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("listen = [")
    with pytest.raises(ConfigError, match=f"^{path}: not valid TOML"):
        load_file(path)
