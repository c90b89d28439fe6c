"""The MariaDB/MySQL log URL: ``mysql://USER[:PASSWORD]@HOST[:PORT]/DB[?OPTIONS]``.

``mariadb://`` is the same. The user and password may be percent-encoded (a ``@``
in a password is ``%40``). Options: ``unix_socket=PATH`` (connect through the
server's socket instead of TCP; the host is then ignored) and ``ssl_ca=PATH``
(TLS, the server's certificate verified against that CA file). Pure: no driver,
no I/O; errors are ``ValueError`` whose message shows the URL without its password
(:mod:`codec` turns them into :class:`~mailsluice.sessionlog.codec.SessionLogError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote, unquote_plus, urlsplit

__all__ = ["DEFAULT_PORT", "MysqlTarget", "parse_mysql_url"]

DEFAULT_PORT = 3306
_OPTIONS = ("unix_socket", "ssl_ca")
_FORM = "mysql://USER:PASSWORD@HOST:PORT/DATABASE"


@dataclass(frozen=True, slots=True)
class MysqlTarget:
    """Where a MariaDB/MySQL session log lives; ``shown`` is safe to print."""

    shown: str  # the URL with the password masked
    host: str
    port: int
    user: str
    database: str
    password: str = field(default="", repr=False)
    unix_socket: str | None = None
    ssl_ca: str | None = None


def _shown(url: str) -> str:
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    netloc = f"{user}:***@{hosts}" if colon else parts.netloc
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}://{netloc}{parts.path}{query}"


def _options(shown: str, query: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for part in query.split("&"):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key, value = unquote(key), unquote_plus(value)
        if not eq or not value:
            raise ValueError(f"log URL {shown}: {part!r} is not KEY=VALUE")
        if key not in _OPTIONS:
            raise ValueError(
                f"log URL {shown}: unknown option {key}=; a mysql:// log takes "
                "unix_socket=PATH (the server's socket) and ssl_ca=PATH (TLS, verified)"
            )
        if key in found:
            raise ValueError(f"log URL {shown}: {key}= is given twice")
        found[key] = value
    return found


def parse_mysql_url(url: str) -> MysqlTarget:
    """Parse a ``mysql://`` or ``mariadb://`` URL; raise ``ValueError`` naming the fix."""
    shown = _shown(url)
    parts = urlsplit(url)
    if parts.scheme not in ("mysql", "mariadb"):
        raise ValueError(f"log URL {shown} is not a mysql:// or mariadb:// URL")
    if parts.fragment:
        raise ValueError(f"log URL {shown}: remove the #fragment; write {_FORM}")
    try:
        port = parts.port
    except ValueError:
        port_text = parts.netloc.rpartition("@")[2].rpartition(":")[2]
        raise ValueError(
            f"log URL {shown}: port {port_text!r} is not a port number (1 to 65535)"
        ) from None
    if port == 0:
        raise ValueError(f"log URL {shown}: port '0' is not a port number (1 to 65535)")
    database = unquote(parts.path[1:])
    if not database or "/" in database:
        what = "names no database" if not database else f"{database!r} is not a database name"
        raise ValueError(f"log URL {shown}: {what}; write {_FORM}")
    options = _options(shown, parts.query)
    if not parts.username:
        raise ValueError(f"log URL {shown} names no user; write {_FORM}")
    if not parts.hostname and "unix_socket" not in options:
        raise ValueError(f"log URL {shown} names no host; write {_FORM} (or add ?unix_socket=PATH)")
    return MysqlTarget(
        shown=shown,
        host=parts.hostname or "localhost",
        port=port or DEFAULT_PORT,
        user=unquote(parts.username),
        password=unquote(parts.password or ""),
        database=database,
        unix_socket=options.get("unix_socket"),
        ssl_ca=options.get("ssl_ca"),
    )
