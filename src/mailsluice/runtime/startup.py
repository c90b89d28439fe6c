"""Checks at start: settings that would make every session fail are refused before serving.

Without them a wrong ``outbound_ip`` or an ``upstream`` name that does not resolve starts
fine, then every session gets ``421 4.4.1``, and the reason is only in the transcripts.
What can be known at start is refused (``ConfigError``, naming the setting and the fix):

* ``outbound_ip`` that no interface of this host has (a socket cannot be bound to it);
* ``outbound_ip`` of the other address family than a fixed ``upstream``;
* an ``upstream`` host name that does not resolve (the resolver says so for certain);
* an ``admin_token_file`` that cannot be read or holds no token;
* a ``log``, ``log_sinks`` file or ``state_file`` in a directory that does not exist (a
  place that is set is used as it is: it is never created, the default place aside).

``serve`` runs them before it writes anything (the self-signed certificate, the log), and
``check-config`` runs the same; ``host=False`` (``check-config --no-host-checks``, for a
file checked on another machine) skips those that ask this host: its addresses, its
resolver, its files.

What cannot be known for certain comes back as warnings, to be said once at start: a
name the resolver cannot look up right now (it may work later), and an ``outbound_ip``
of one family while clients may arrive over the other (their MX is then of that family
and cannot be dialled from it).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mailsluice.runtime.net.localaddrs import LocalAddressError, interface_addresses
from mailsluice.sessionlog.codec import SessionLogError, parse_log_url
from mailsluice.settings.config import ConfigError, HostPort, Settings

Resolver = Callable[..., list[tuple[Any, ...]]]

#: getaddrinfo errors that say nothing for certain about the name (try again later)
_NOT_NOW = frozenset(
    code
    for code in (
        getattr(socket, "EAI_AGAIN", None),
        getattr(socket, "EAI_SYSTEM", None),
        getattr(socket, "EAI_MEMORY", None),
    )
    if code is not None
)


def check(
    settings: Settings, resolve: Resolver = socket.getaddrinfo, *, host: bool = True
) -> list[str]:
    """Raise ``ConfigError`` for a setting that would fail every session; return warnings.
    ``host``: also the checks that ask this host (see the module docstring)."""
    _check_sender_rules(settings)
    if not host:
        return []
    warnings: list[str] = []
    upstream_families: set[int] = set()
    if settings.upstream is not None:
        upstream_families, warning = _upstream_families(settings.upstream, resolve)
        warnings += [warning] if warning else []
    if settings.outbound_ip is not None:
        source = ipaddress.ip_address(settings.outbound_ip)
        family = socket.AF_INET6 if source.version == 6 else socket.AF_INET
        if settings.upstream is not None and upstream_families == {_other(family)}:
            raise ConfigError(
                f"outbound_ip (--outbound-ip): {source} is {_name(family)} but upstream "
                f"{settings.upstream} is {_name(_other(family))}: no connection to it can "
                f"start from that address. Use an {_name(_other(family))} address of this "
                "host, or leave the setting out"
            )
        _check_bindable(source, family)
        if settings.upstream is None:
            warnings += _family_warnings(settings, source, family)
    _check_sources(settings)
    _check_places(settings)
    _check_token(settings)
    return warnings


def _check_sender_rules(settings: Settings) -> None:
    """A sender rule needs fair sharing (``--no-fair-sharing`` may have turned it off
    after the file was read)."""
    if settings.sources.by_sender and not settings.fair.enabled:
        raise ConfigError(
            "source_rules: a rule by sender_domain needs fair sharing (the sender is known "
            "only at MAIL; without it the MX connection is made when the client connects): "
            "drop --no-fair-sharing, or choose by tenant, client or destination"
        )


def _check_places(settings: Settings) -> None:
    """The directories of the files that are set exist: they are used as they are."""
    places: list[tuple[str, Path]] = []
    for key, url in (("log", settings.log), *(("log_sinks", u) for u in settings.log_sinks)):
        try:
            path = parse_log_url(url).path if url else None
        except SessionLogError:
            continue  # (the configuration's own checks name it)
        if path is not None:
            places.append((key, path))
    if settings.state_file:
        places.append(("state_file", Path(settings.state_file)))
    for key, path in places:
        parent = path.parent
        if not parent.is_dir():
            raise ConfigError(
                f"{key}: the directory {parent} of {path} does not exist, and a place that "
                f"is set is used as it is, never created: create it for the service's user "
                f"(install -d -o mailsluice -m 750 {parent}), or set {key} to a file in an "
                "existing directory"
            )


def _check_token(settings: Settings) -> None:
    """``admin_token_file`` is read as the admin server will read it."""
    if settings.admin_listen is not None:
        from mailsluice.runtime.admin.host import read_token

        read_token(settings)


def _check_sources(settings: Settings) -> None:
    """Every ``[[source_addresses]]`` address can be bound."""
    for address in settings.sources.addresses():
        source = ipaddress.ip_address(address)
        family = socket.AF_INET6 if source.version == 6 else socket.AF_INET
        _check_bindable(source, family, key="source_addresses")


def _name(family: int) -> str:
    return "IPv6" if family == socket.AF_INET6 else "IPv4"


def _other(family: int) -> int:
    return socket.AF_INET if family == socket.AF_INET6 else socket.AF_INET6


def _upstream_families(upstream: HostPort, resolve: Resolver) -> tuple[set[int], str | None]:
    """The address families ``upstream`` resolves to (empty if unknown), and a warning."""
    try:
        literal = ipaddress.ip_address(upstream.host)
    except ValueError:
        pass
    else:
        return {socket.AF_INET6 if literal.version == 6 else socket.AF_INET}, None
    try:
        infos = resolve(upstream.host, upstream.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in _NOT_NOW:
            return set(), (
                f"upstream {upstream}: cannot resolve {upstream.host!r} now ({exc.strerror}); "
                "starting anyway: sessions get 421 4.4.1 until it resolves"
            )
        raise ConfigError(
            f"upstream (--upstream): {upstream.host!r} does not resolve ({exc.strerror}), so "
            "every session would get 421 4.4.1. Correct the name, or write an IP address "
            "(e.g. --upstream 192.0.2.25:25)"
        ) from None
    return {int(info[0]) for info in infos}, None


def _check_bindable(
    source: ipaddress.IPv4Address | ipaddress.IPv6Address,
    family: int,
    key: str = "outbound_ip (--outbound-ip)",
) -> None:
    """Bind a socket to ``source`` as the dialler will: fails when no interface has it."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(source), 0))
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:
                raise ConfigError(
                    f"{key}: cannot use {source} as the source "
                    f"address ({exc.strerror}); leave the setting out, or choose another"
                ) from None
            raise ConfigError(
                f"{key}: {source} is not an address of this host (no "
                "interface has it), so every connection to an MX would fail with 421 4.4.1. "
                f"Use one of its {_name(family)} addresses ({_own(family)}), add it to an "
                "interface (ip address add ...), or leave the setting out (the kernel then "
                "picks the source)"
            ) from None


def _own(family: int) -> str:
    try:
        addresses = interface_addresses()
    except LocalAddressError:
        return "see ip address"
    wanted = 6 if family == socket.AF_INET6 else 4
    mine = [str(a) for a in addresses if a.version == wanted and not a.is_loopback]
    return ", ".join(mine) or "it has none"


def _family_warnings(
    settings: Settings, source: ipaddress.IPv4Address | ipaddress.IPv6Address, family: int
) -> list[str]:
    """In transparent mode the MX is of the client's family: say which clients will fail."""
    other = [
        str(address)
        for address in settings.listen_addresses
        if _listen_family(address) == _other(family)
    ]
    if not other:
        return []
    return [
        f"outbound_ip {source} is {_name(family)}: clients arriving on {', '.join(other)} "
        f"are redirected connections to {_name(_other(family))} MXes, which cannot be dialled "
        f"from it; they will get 421 4.4.1 (one outbound_ip serves one address family)"
    ]


def _listen_family(address: HostPort) -> int | None:
    try:
        literal = ipaddress.ip_address(address.host)
    except ValueError:
        return None  # a name: its families are known only once it is resolved
    return socket.AF_INET6 if literal.version == 6 else socket.AF_INET
