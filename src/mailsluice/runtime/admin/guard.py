"""Which requests the admin server obeys: those meant for it, and writes from its own page.

A loopback admin server without a token (``admin_token_file`` unset, which is allowed on
127.0.0.1 / [::1]) is still reachable from every web page open in a browser on the host:

* **DNS rebinding.** A page of the attacker's, at a name the attacker then resolves to
  127.0.0.1, talks to this server as its own origin and reads the answers (sessions,
  transcripts). Its requests name the attacker's host in ``Host``. So every request must
  name this server in ``Host``: one of its addresses (what it listens on; on a wildcard
  address, the host's: the address the client reached, any loopback address, every
  interface's, read at start), ``localhost``, ``admin_listen``'s own name, or a name the
  operator lists in ``admin_allowed_hosts``. Anything else: 421, naming that setting. The
  port is not compared (a reverse proxy may forward ``Host`` as the browser sent it; an IP
  literal cannot be rebound). A request without ``Host`` (HTTP/1.0) comes from no browser.
* **Cross-site writes.** A page on any other origin can send a "simple" request, ``POST``
  with ``text/plain`` or a form type, without a CORS preflight, and the server would act
  on it (suspend, drain, abort) even though the page never reads the answer. So a write
  (any method but GET and HEAD) needs ``Content-Type: application/json`` (415 otherwise),
  which a page can send cross-site only after a preflight this server never grants, and
  an ``Origin`` that is this server's own, as the request's ``Host`` names it (403
  otherwise), or none at all (``mailsluice ctl``, curl: clients that are not browsers).

The checks run before the token's (``http.AdminServer``), whatever the route; with a
token set they are a second wall (a page cannot know the token). This module is pure: it
gets the header values and the connection's local address, and answers what to refuse.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["HostGuard", "Refusal", "host_of"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
#: (status, what is wrong and what to do)
Refusal = tuple[int, str]

SETTING = "admin_allowed_hosts"
READS = frozenset({"GET", "HEAD"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _address(text: str) -> Address | None:
    """``text`` as an IP address (an IPv6 zone dropped, IPv4-mapped as IPv4), or None."""
    try:
        address = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def host_of(value: str) -> tuple[str, int | None] | None:
    """A ``Host`` value (``name``, ``name:port``, ``1.2.3.4:port``, ``[v6]:port``) as
    (host in lower case, no brackets, no trailing dot; port), or None if it is not one."""
    text = value.strip().lower()
    port_text = ""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")) or _address(host) is None:
            return None
        port_text = rest[1:]
        if rest and not port_text:
            return None
    elif text.count(":") > 1:  # an IPv6 literal without brackets (not valid, yet clear)
        host = text
        if _address(host) is None:
            return None
    else:
        host, sep, port_text = text.partition(":")
        if sep and not port_text:
            return None
    if port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536):
        return None
    host = host.rstrip(".") if _address(host) is None else host
    if not host or any(c in host for c in "/@?#\\ \t"):
        return None
    return host, int(port_text) if port_text else None


@dataclass(frozen=True, slots=True)
class HostGuard:
    """What names this server (see the module docstring)."""

    names: frozenset[str]  # lower case, no trailing dot
    addresses: frozenset[Address]
    any_local: bool  # listening on a wildcard address: every address of the host
    where: str  # admin_listen, for the messages

    @classmethod
    def serving(
        cls,
        bound: Iterable[str],
        *,
        allowed: Iterable[str] = (),
        listen_name: str | None = None,
        host_addresses: Iterable[Address] = (),
        where: str = "",
    ) -> HostGuard:
        """The guard of a server bound to ``bound`` (its sockets' addresses);
        ``allowed``: ``admin_allowed_hosts``; ``host_addresses``: the host's interface
        addresses (used when one of ``bound`` is a wildcard)."""
        names = {"localhost"}
        addresses: set[Address] = set()
        for item in (*allowed, *([listen_name] if listen_name else [])):
            address = _address(item.strip("[]"))
            if address is None:
                names.add(item.lower().rstrip("."))
            else:
                addresses.add(address)
        any_local = False
        for text in bound:
            address = _address(text)
            if address is None:
                continue
            if address.is_unspecified:
                any_local = True
            else:
                addresses.add(address)
        if any_local:
            addresses.update(host_addresses)
        return cls(frozenset(names), frozenset(addresses), any_local, where)

    def names_us(self, host: str, local: str | None) -> bool:
        """Whether ``host`` (from ``host_of``) is this server, reached at ``local``."""
        address = _address(host)
        if address is None:
            return host in self.names
        if address in self.addresses:
            return True
        if self.any_local and address.is_loopback:
            return True
        return local is not None and address == _address(local)

    def refusal(self, method: str, headers: Mapping[str, str], local: str | None) -> Refusal | None:
        """What to answer instead of serving the request, or None to serve it.
        ``headers``: names in lower case; ``local``: the connection's local address."""
        given = headers.get("host")
        host: tuple[str, int | None] | None = None
        if given is not None:
            host = host_of(given)
            if host is None:
                return 400, f"the Host header {given!r} is not HOST[:PORT]"
            if not self.names_us(host[0], local):
                return 421, (
                    f"the Host header names {host[0]!r}, which is not this admin server "
                    f"({self.where or 'its address'}): a page that rebinds a DNS name to it "
                    f"sends such requests. Ask for it by its address or localhost, or list "
                    f"the name in {SETTING} (docs/configuration.md)"
                )
        if method in READS:
            return None
        origin = headers.get("origin")
        if origin is not None and not self._own_origin(origin, host):
            ours = f"http://{given}" if given else "none"
            return 403, (
                f"the Origin {origin!r} is not this admin server's own ({ours}): a write "
                "must come from the dashboard served here, or from a client that sends no "
                "Origin (mailsluice ctl, curl); web pages elsewhere may not act on it"
            )
        content_type = headers.get("content-type", "")
        if content_type.partition(";")[0].strip().lower() != "application/json":
            return 415, (
                f"a write needs Content-Type: application/json (got {content_type or 'none'!r}): "
                "e.g. curl -X POST -H 'Content-Type: application/json' ..."
            )
        return None

    @staticmethod
    def _own_origin(origin: str, host: tuple[str, int | None] | None) -> bool:
        """``origin`` (``scheme://host[:port]``) is the origin ``host`` (the request's
        ``Host``) belongs to: the same host, and the same port when ``Host`` has one."""
        if host is None:
            return False
        try:
            parts = urlsplit(origin.strip())
            port = parts.port
        except ValueError:
            return False
        if parts.scheme not in _DEFAULT_PORTS or parts.path or parts.query or parts.username:
            return False
        name = (parts.hostname or "").rstrip(".")
        mine, wanted = _address(name), _address(host[0])
        if (mine if mine is not None else name) != (wanted if wanted is not None else host[0]):
            return False
        return host[1] is None or (port or _DEFAULT_PORTS[parts.scheme]) == host[1]
