"""The client leg's server context (``runtime.clienttls``): its protocol and suite policy,
the self-signed pair (made once with mode 0600, reused, named after the proxy), the
operator's own pair, and the start-up errors that name the key and the fix."""

from __future__ import annotations

import os
import ssl
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.x509.oid import NameOID

from mailsluice.relay.config import RelayConfig
from mailsluice.runtime.tls import client as clienttls
from mailsluice.runtime.tls.client import CERT_NAME, KEY_NAME, server_context
from mailsluice.settings.config import ConfigError, HostPort, Settings
from mailsluice.settings.tls import TlsSettings

pytestmark = pytest.mark.integration


def settings_for(tmp_path: Path, **tls: object) -> Settings:
    return Settings(
        listen=HostPort("127.0.0.1", 0),
        upstream=HostPort("127.0.0.1", 9),
        log=f"sqlite:{tmp_path / 'sessions.db'}",
        relay=RelayConfig(hostname="relay.example.net"),
        tls=TlsSettings(**tls),  # type: ignore[arg-type]
    )


def _tls12_suites(context: ssl.SSLContext) -> list[dict[str, object]]:
    return [c for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"]


def test_the_default_policy(tmp_path: Path) -> None:
    context = server_context(settings_for(tmp_path))
    assert context is not None
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
    assert context.options & ssl.OP_NO_COMPRESSION
    assert context.options & ssl.OP_NO_RENEGOTIATION
    assert context.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    suites = _tls12_suites(context)
    assert suites  # TLS 1.2 is served, with forward-secret key exchange only
    assert {c["kea"] for c in suites} == {"kx-ecdhe"}
    assert all("GCM" in str(c["name"]) or "CHACHA20" in str(c["name"]) for c in suites)


def test_tls_1_3_only(tmp_path: Path) -> None:
    context = server_context(settings_for(tmp_path, client_tls_min_version="1.3"))
    assert context is not None
    assert context.minimum_version is ssl.TLSVersion.TLSv1_3


def test_off_gives_no_context_and_makes_no_files(tmp_path: Path) -> None:
    assert server_context(settings_for(tmp_path, client_tls=False)) is None
    assert not (tmp_path / KEY_NAME).exists()


def test_the_self_signed_pair_is_made_private_once_and_reused(tmp_path: Path) -> None:
    old = os.umask(0)  # even a permissive umask never makes the key readable by others
    try:
        assert server_context(settings_for(tmp_path)) is not None
    finally:
        os.umask(old)
    key, cert = tmp_path / KEY_NAME, tmp_path / CERT_NAME
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(cert.stat().st_mode) == 0o644
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(f".{KEY_NAME}")]
    assert leftovers == []
    certificate = x509.load_pem_x509_certificate(cert.read_bytes())
    [common_name] = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert common_name.value == "relay.example.net"
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert names.value.get_values_for_type(x509.DNSName) == ["relay.example.net"]
    before = (key.read_bytes(), cert.read_bytes(), key.stat().st_ino)
    assert server_context(settings_for(tmp_path)) is not None  # a later start
    assert (key.read_bytes(), cert.read_bytes(), key.stat().st_ino) == before


def test_a_half_made_pair_is_made_again(tmp_path: Path) -> None:
    """A start cut short after the key: the next start makes both again."""
    clienttls.self_signed_pair(tmp_path, "relay.example.net")
    (tmp_path / CERT_NAME).unlink()
    old_key = (tmp_path / KEY_NAME).read_bytes()
    assert server_context(settings_for(tmp_path)) is not None
    assert (tmp_path / CERT_NAME).exists()
    assert (tmp_path / KEY_NAME).read_bytes() != old_key


def test_the_pair_is_kept_beside_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "state" / "destinations.json"
    settings = replace(settings_for(tmp_path), log="none:", state_file=str(state))
    assert server_context(settings) is not None
    assert (state.parent / KEY_NAME).exists()


def test_without_a_place_the_pair_is_thrown_away(tmp_path: Path) -> None:
    settings = replace(settings_for(tmp_path), log="none:")
    assert clienttls.pair_directory(settings) is None
    assert server_context(settings) is not None
    assert not (tmp_path / KEY_NAME).exists()


def test_the_operators_pair_is_used(tmp_path: Path) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("relay.example.net")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    context = server_context(
        settings_for(tmp_path, client_tls_cert=str(cert), client_tls_key=str(key))
    )
    assert context is not None
    assert not (tmp_path / KEY_NAME).exists()  # no self-signed pair made


def test_a_missing_certificate_names_the_keys_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(ConfigError) as caught:
        server_context(
            settings_for(tmp_path, client_tls_cert=str(missing), client_tls_key=str(missing))
        )
    text = str(caught.value)
    assert "client_tls_cert" in text
    assert "client_tls_key" in text
    assert str(missing) in text
    assert "remove both keys for a self-signed pair" in text


def test_a_key_that_does_not_match_is_refused(tmp_path: Path) -> None:
    ca = trustme.CA()
    one, other = ca.issue_cert("a.example"), ca.issue_cert("b.example")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    one.cert_chain_pems[0].write_to_path(str(cert))
    other.private_key_pem.write_to_path(str(key))
    with pytest.raises(ConfigError, match="client_tls_cert"):
        server_context(settings_for(tmp_path, client_tls_cert=str(cert), client_tls_key=str(key)))


def test_a_cipher_list_openssl_rejects_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="client_tls_ciphers"):
        server_context(settings_for(tmp_path, client_tls_ciphers="NO-SUCH-SUITE"))


def test_an_unusable_place_names_the_fix(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"  # where the directory should be (a test that holds as root)
    blocked.write_text("")
    settings = replace(settings_for(tmp_path), log=f"sqlite:{blocked / 'sessions.db'}")
    with pytest.raises(ConfigError, match="client_tls_cert and client_tls_key are unset"):
        server_context(settings)


def test_check_config_loads_the_operators_pair_and_makes_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mailsluice.cli.main import main

    missing = tmp_path / "nowhere.pem"
    config = tmp_path / "mailsluice.toml"
    config.write_text(
        f'log = "sqlite:{tmp_path / "sessions.db"}"\n'
        f'client_tls_cert = "{missing}"\nclient_tls_key = "{missing}"\n'
    )
    assert main(["check-config", str(config)]) == 2
    assert "client_tls_cert" in capsys.readouterr().err
    config.write_text(f'log = "sqlite:{tmp_path / "sessions.db"}"\n')
    assert main(["check-config", str(config)]) == 0
    assert "client TLS self-signed" in capsys.readouterr().out
    assert not (tmp_path / KEY_NAME).exists()


def test_a_pair_the_child_process_cannot_make_stops_the_start_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the pair is made by a child process (the worker never imports cryptography for it)
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(ConfigError) as refused:
        server_context(settings_for(tmp_path))
    said = str(refused.value)
    assert "the process making a self-signed pair failed" in said
    assert "set client_tls_cert and client_tls_key" in said
    assert not (tmp_path / CERT_NAME).exists()
    assert not (tmp_path / KEY_NAME).exists()
