"""Configuration: defaults, the TOML file, flags over the file, and clear errors."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from mailsluice.cli.main import build_parser, main, settings_from_args
from mailsluice.relay.config import BareNewlinePolicy, TlsMode
from mailsluice.settings.config import ConfigError, HostPort, Settings, load_file, parse_host_port

pytestmark = pytest.mark.unit

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


def test_defaults_are_the_documented_ones() -> None:
    settings = Settings()
    assert settings.listen == HostPort("127.0.0.1", 10025)
    assert settings.upstream is None
    assert settings.log is None  # the default place, /var/lib/mailsluice (logplace)
    assert ipaddress.ip_network("127.0.0.0/8") in settings.allow
    assert settings.relay.bare_newline is BareNewlinePolicy.REJECT
    assert settings.relay.tls is TlsMode.OPPORTUNISTIC
    assert settings.relay.message_size_limit == 10_240_000
    assert settings.relay.xverp is True
    assert (settings.max_connections, settings.max_connections_per_client) == (1000, 200)


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


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('listen = "nohost"', "listen"),
        ('listen = "1.2.3.4:99999"', "listen"),
        ('allow = ["10.0.0.300/8"]', "allow"),
        ('allow = "10.0.0.0/8"', "allow"),
        ('outbound_ip = "x"', "outbound_ip"),
        ('log = "mysql:x"', "log"),
        ("workers = 0", "workers"),
        ("max_connections = 0", "max_connections"),
        (
            "max_connections_per_client = -1",
            "max_connections_per_client: expected a whole number of at least 0, got -1",
        ),
        ("max_connections_per_client = 2.5", "max_connections_per_client: expected a whole"),
        ("max_connections_per_client = true", "max_connections_per_client: expected a whole"),
        ('max_connections_per_client = "50"', "max_connections_per_client: expected a whole"),
        ('bare_newline = "ignore"', "bare_newline"),
        ("message_size_limit = 1.5", "message_size_limit"),
        ("verbose = 1", "verbose"),
        ("[timeouts]\nconnekt = 3", "timeouts.connekt"),
        ("[timeouts]\nconnect = -1", "timeouts.connect"),
        ('reuse_connections = "yes"', "reuse_connections: expected true or false"),
        ("xverp = 1", "xverp: expected true or false"),
        ("reuse_idle_timeout = 0", "reuse_idle_timeout: expected a number of at least 0.001"),
        ("reuse_max_sessions = 0", "reuse_max_sessions: expected a whole number of at least 1"),
        ("reuse_max_idle = 1.5", "reuse_max_idle: expected a whole number"),
        ("colour = 1", "colour"),
        ("listen = [", "not valid TOML"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, names: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        load_file(path)


def test_ipv6_listen() -> None:
    assert parse_host_port("[::1]:25", "listen") == HostPort("::1", 25)
    assert str(HostPort("::1", 25)) == "[::1]:25"


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


def test_per_client_cap_flag_is_validated_like_the_key() -> None:
    args = build_parser().parse_args(["serve", "--max-connections-per-client", "-3"])
    with pytest.raises(
        ConfigError, match="max_connections_per_client: expected a whole number of at least 0"
    ):
        settings_from_args(args)
    args = build_parser().parse_args(["serve", "--max-connections-per-client", "50"])
    assert settings_from_args(args).max_connections_per_client == 50
    assert settings_from_args(build_parser().parse_args(["serve"])).max_connections_per_client == (
        200
    )


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
