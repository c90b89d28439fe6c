"""The TLS settings of both legs, as frozen values: the client leg (the tenants'
STARTTLS) and the MX leg (policy levels, ``[[tls_policies]]``, DANE, MTA-STS, TLS
reporting, session resumption).

```toml
# the client leg: STARTTLS offered to the tenants' MSAs
client_tls = true                  # default on
client_tls_cert = "/etc/mailsluice/tls/cert.pem"   # without both: a self-signed pair
client_tls_key = "/etc/mailsluice/tls/key.pem"     # made at first start (mode 0600)
client_tls_min_version = "1.2"     # "1.2" or "1.3"
client_tls_ciphers = "ECDHE+AESGCM:ECDHE+CHACHA20"  # OpenSSL list for TLS 1.2 (FS only)

[tls_policy]                       # the MX leg
default_level = "may"              # none, may, encrypt, verify, secure, dane
dane = true                        # look up TLSA records (needs a validating resolver)
mta_sts = true                     # look up and enforce MTA-STS policies
resolver = "127.0.0.1:53"          # the validating resolver to ask (default: resolv.conf)
trust_ad = true                    # believe its AD bit (only for a loopback resolver)
ca_file = "/etc/ssl/certs/ca-certificates.crt"   # trust anchors for verify/secure/STS
resumption = true                  # resume TLS sessions toward the MX
tlsrpt = true                      # count results for RFC 8460 reports
report_org = "mailsluice at host.example"   # organization-name in the reports
report_contact = "postmaster@host.example"  # contact-info in the reports

[[tls_policies]]                   # the operator's word; first match wins
match = "example.org"              # recipient domain (".example.org": under it),
level = "verify"                   # MX host name ("mx.example.net", ".example.net"),
names = ["mx.example.net"]         # or the MX address / CIDR ("192.0.2.0/24")
```

Every error names the key and the fix (``TlsConfigError``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mailsluice.policy.tls.model import Level, TlsPolicyRule
from mailsluice.settings.keyhints import TABLE_KEYS, hint
from mailsluice.settings.values import SettingsError

__all__ = ["TlsConfigError", "TlsPolicyRule", "TlsSettings", "parse", "parse_resolver"]

DEFAULT_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"  # forward secrecy only (TLS 1.2 suites)
CLIENT_KEYS = ("client_tls", "client_tls_cert", "client_tls_key", "client_tls_min_version",
               "client_tls_ciphers")  # fmt: skip
_VERSIONS = ("1.2", "1.3")


class TlsConfigError(SettingsError):
    """A TLS setting is wrong; the message names the key and the fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsSettings:
    # the client leg
    client_tls: bool = True
    client_tls_cert: str | None = None
    client_tls_key: str | None = None
    client_tls_min_version: str = "1.2"
    client_tls_ciphers: str = DEFAULT_CIPHERS
    # the MX leg
    default_level: Level = Level.MAY
    dane: bool = True
    mta_sts: bool = True
    resolver: str | None = None  # "host:port" or "host"; None: the system's resolv.conf
    trust_ad: bool = True
    ca_file: str | None = None  # None: the system store
    resumption: bool = True
    tlsrpt: bool = True
    report_org: str = "mailsluice"
    report_contact: str = "postmaster"
    mta_sts_port: int = 443  # the policy host's port (tests only change it)
    rules: tuple[TlsPolicyRule, ...] = field(default_factory=tuple)


def parse(top: Mapping[str, Any], table: Any = None, rules: Any = None) -> TlsSettings:
    """The TLS settings: ``top`` holds the client_tls_* keys found at the top level,
    ``table`` is ``[tls_policy]``, ``rules`` the ``[[tls_policies]]`` list."""
    values: dict[str, Any] = {}
    for key, raw in top.items():
        if key == "client_tls":
            values[key] = _bool(raw, key)
        elif key in ("client_tls_cert", "client_tls_key"):
            values[key] = _text(raw, key) or None
        elif key == "client_tls_min_version":
            version = _text(raw, key)
            if version not in _VERSIONS:
                raise TlsConfigError(f'{key}: expected "1.2" or "1.3", not {raw!r}')
            values[key] = version
        elif key == "client_tls_ciphers":
            values[key] = _text(raw, key)
        else:
            raise TlsConfigError(
                f"{key}: unknown setting{hint(key, CLIENT_KEYS)} (see docs/tls.md)"
            )
    if bool(values.get("client_tls_cert")) != bool(values.get("client_tls_key")):
        raise TlsConfigError(
            "client_tls_cert and client_tls_key: give both (or neither, for a self-signed pair)"
        )
    if table is not None and not isinstance(table, Mapping):
        raise TlsConfigError("tls_policy: expected a table, e.g. [tls_policy]")
    for key, raw in dict(table or {}).items():
        name = f"tls_policy.{key}"
        if key == "default_level":
            values[key] = _level(raw, name)
        elif key in ("dane", "mta_sts", "trust_ad", "resumption", "tlsrpt"):
            values[key] = _bool(raw, name)
        elif key == "resolver":
            text = _text(raw, name).strip()
            if text:
                try:
                    parse_resolver(text)
                except ValueError as exc:
                    raise TlsConfigError(
                        f"{name}: expected an IP address and an optional port, e.g. "
                        f'"127.0.0.1:53" or "[::1]:53", not {raw!r} ({exc})'
                    ) from None
            values[key] = text or None
        elif key == "ca_file":
            values[key] = _text(raw, name) or None
        elif key in ("report_org", "report_contact"):
            values[key] = _text(raw, name)
        elif key == "mta_sts_port":
            if isinstance(raw, bool) or not isinstance(raw, int) or not 0 < raw < 65536:
                raise TlsConfigError(f"{name}: expected a port number, e.g. 443")
            values[key] = raw
        else:
            said = hint(key, TABLE_KEYS["tls_policy"], "tls_policy")
            raise TlsConfigError(f"{name}: unknown key{said} (see docs/tls.md)")
    if rules is not None:
        if not isinstance(rules, list):
            raise TlsConfigError("tls_policies: expected an array of tables, [[tls_policies]]")
        values["rules"] = tuple(_rule(i, r) for i, r in enumerate(rules))
    return TlsSettings(**values)


def parse_resolver(text: str) -> tuple[str, int]:
    """``tls_policy.resolver`` as (address, port): "127.0.0.1", "127.0.0.1:5353",
    "::1", "[::1]:5353". ValueError when the address is not an IP address."""
    text = text.strip()
    host, port = text, 53
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            port = int(rest.removeprefix(":"))
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = int(port_text)
    ipaddress.ip_address(host)  # ValueError: the resolver must be an address
    if not 0 < port < 65536:
        raise ValueError(f"port out of range: {port}")
    return host, port


def _rule(index: int, raw: Any) -> TlsPolicyRule:
    where = f"tls_policies[{index}]"
    if not isinstance(raw, Mapping):
        raise TlsConfigError(f"{where}: expected a table with match and level")
    unknown = set(raw) - {"match", "level", "names"}
    if unknown:
        raise TlsConfigError(f"{where}: unknown key {sorted(unknown)[0]!r} (match, level, names)")
    if "match" not in raw or "level" not in raw:
        raise TlsConfigError(f'{where}: needs match and level, e.g. match = "example.org"')
    text = _text(raw["match"], f"{where}.match").strip().lower().rstrip(".")
    level = _level(raw["level"], f"{where}.level")
    names_raw = raw.get("names", [])
    if not isinstance(names_raw, list) or not all(isinstance(n, str) and n for n in names_raw):
        raise TlsConfigError(f'{where}.names: expected a list of names, e.g. ["mx.example.net"]')
    names = tuple(n.strip().lower().rstrip(".") for n in names_raw)
    if not text:
        raise TlsConfigError(f"{where}.match: empty")
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        network = None
    if network is not None:
        return TlsPolicyRule(level=level, network=network, names=names, text=text)
    host = text.removeprefix("mx:")
    if text.startswith("mx:"):  # "mx:mx.example.net": an MX host name, said explicitly
        return TlsPolicyRule(level=level, host=host, names=names, text=text)
    # a name: the recipient domain, and the MX host name too (the same rule serves both
    # "example.org" and "mx.example.org"); the policy layer tries the domain first
    return TlsPolicyRule(level=level, domain=text, host=text, names=names, text=text)


def _level(raw: Any, key: str) -> Level:
    choices = tuple(level.value for level in Level)
    if raw not in choices:
        raise TlsConfigError(f"{key}: expected one of {', '.join(choices)}, not {raw!r}")
    return Level(raw)


def _bool(raw: Any, key: str) -> bool:
    if not isinstance(raw, bool):
        raise TlsConfigError(f"{key}: expected true or false")
    return raw


def _text(raw: Any, key: str) -> str:
    if not isinstance(raw, str):
        raise TlsConfigError(f"{key}: expected a string")
    return raw
