"""Admission: allowed client networks and routing-loop detection (pure).

No open relay: only clients from the allowed networks may use the proxy. No loops: a
connection whose original destination is the proxy itself (nothing was REDIRECTed, or the
proxy's own outbound traffic was redirected back to it) is refused without dialling.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from mailsluice.smtp.replies import Reply

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _plain_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def client_allowed(client_ip: str, allow: Iterable[Network]) -> bool:
    address = _plain_ip(client_ip)
    return address is not None and any(address in network for network in allow)


def is_loop(destination: tuple[str, int], own: Iterable[tuple[str, int]]) -> bool:
    """True when the destination is one of our own listening addresses."""
    dest_ip = None  # parsed only when a port matches (the usual case: none does)
    for host, port in own:
        if port != destination[1]:
            continue
        dest_ip = dest_ip or _plain_ip(destination[0])
        own_ip = _plain_ip(host)
        if own_ip is not None and (own_ip == dest_ip or own_ip.is_unspecified):
            return True
    return False


def admit(
    client_ip: str,
    destination: tuple[str, int],
    *,
    allow: Iterable[Network],
    own: Iterable[tuple[str, int]],
    hostname: str,
) -> Reply | None:
    """The refusal to give this connection, or None to relay it."""
    if not client_allowed(client_ip, allow):
        return denied(client_ip, hostname)
    if is_loop(destination, own):
        return loop_refusal(hostname)
    return None


def denied(client_ip: str, hostname: str) -> Reply:
    """The refusal for a client outside the allowed networks: ``421 4.7.1``.

    Transient on purpose: nothing is relayed either way (no open relay), but a 5xx would
    make an MSA that is ours, refused only because ``allow`` is wrong, bounce its mail;
    with a 4xx it keeps the mail queued and retries once the setting is fixed. A stranger
    that retries costs a connection and one line, never an upstream dial."""
    return Reply.make(421, "4.7.1", f"{hostname} Error: access denied for {client_ip}")


def loop_refusal(hostname: str) -> Reply:
    return Reply.make(421, "4.4.6", f"{hostname} Error: routing loop detected")
