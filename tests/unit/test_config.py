"""Configuration: defaults, the keys read from TOML text, flags, and clear errors (files:
``tests/integration/test_config_file.py``)."""

from __future__ import annotations

import ipaddress
import tomllib

import pytest

from mailsluice.cli.main import build_parser, settings_from_args
from mailsluice.relay.config import BareNewlinePolicy, TlsMode
from mailsluice.settings.config import (
    ConfigError,
    HostPort,
    Settings,
    parse_host_port,
    settings_from_mapping,
)

pytestmark = pytest.mark.unit


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
    ],
)
def test_errors_name_the_key(text: str, names: str) -> None:
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        settings_from_mapping(tomllib.loads(text))


def test_ipv6_listen() -> None:
    assert parse_host_port("[::1]:25", "listen") == HostPort("::1", 25)
    assert str(HostPort("::1", 25)) == "[::1]:25"


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
