"""Start every private service fixture while the services' default ports are taken.

``python -m tests.support.private_services`` (run from the repository root, normally in
a fresh network namespace by ``tests/integration/test_private_services.py``) first
listens on the ports the machine's own services would hold: PostgreSQL 5432, Redis 6379,
OpenDKIM 8891, rspamd 11332-11334, SMTP 25 (Postfix), HTTP 80 (nginx), as a running
system instance of each would. Then it starts the tests' private PostgreSQL, rspamd,
OpenDKIM and Postfix (``tests.support``) one after the other and checks that each
answers on its own port: a query, a milter option negotiation, an SMTP greeting. It
prints one JSON object: ``{"held": [ports], "services": {name: "ok" | "skipped: ..." |
"failed: ..."}}``.

If a fixture relied on the system services being stopped (their default port, socket,
pid file), it would fail here.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import traceback
from collections.abc import Callable, Iterator

from _pytest.outcomes import Skipped

from mailsluice.milter.protocol import DEFAULT_OFFER, OptNeg, PacketDecoder, frame

#: the ports the machine's own services listen on by default
DEFAULT_PORTS = {
    5432: "postgresql",
    6379: "redis",
    8891: "opendkim",
    11332: "rspamd proxy (milter)",
    11333: "rspamd normal worker",
    11334: "rspamd controller",
    25: "postfix",
    80: "nginx",
}


@contextlib.contextmanager
def held_ports() -> Iterator[list[int]]:
    """Listen on every default port, IPv4 and IPv6 wildcard: as the system services do."""
    with contextlib.ExitStack() as stack:
        held: list[int] = []
        for port in DEFAULT_PORTS:
            for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
                sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((host, port))
                sock.listen(8)
            held.append(port)
        yield held


def _milter_answers(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(frame(b"O", DEFAULT_OFFER.payload()))
        decoder = PacketDecoder()
        while not (packets := decoder.feed(sock.recv(4096) or b"")):
            pass
        code, data = packets[0]
        if code != b"O":
            raise AssertionError(f"option negotiation answered {code!r}")
        OptNeg.parse(data)


def _smtp_greets(host: str, port: int) -> None:
    with socket.create_connection((host, port), timeout=30) as sock:
        greeting = sock.recv(512)
        if not greeting.startswith(b"220"):
            raise AssertionError(f"greeting {greeting!r}")


def _postgres() -> None:
    from tests.support.postgres import private_server

    with private_server() as server:
        if server.port in DEFAULT_PORTS:
            raise AssertionError(f"listens on a default port, {server.port}")
        [row] = server.sql("SELECT 1 AS one")
        assert row["one"] == 1


def _rspamd() -> None:
    from tests.support.milters import rspamd_milter

    with rspamd_milter() as rspamd:
        _milter_answers(rspamd.port)


def _opendkim() -> None:
    from tests.support.milters import opendkim_milter

    with opendkim_milter() as dkim:
        _milter_answers(dkim.port)


def _postfix() -> None:
    from mailsluice_lab.postfix import PostfixMSA, missing

    reason = missing()
    if reason is not None:
        raise Skipped(reason)
    with PostfixMSA(relayhost=None, name="probe") as msa:
        _smtp_greets(msa.host, msa.port)


CHECKS: dict[str, Callable[[], None]] = {
    "postgresql": _postgres,
    "rspamd": _rspamd,
    "opendkim": _opendkim,
    "postfix": _postfix,
}


def main() -> int:
    results: dict[str, str] = {}
    with held_ports() as held:
        for name, check in CHECKS.items():
            try:
                check()
            except Skipped as skip:
                results[name] = f"skipped: {skip.msg}"
            except Exception as exc:
                detail = "".join(traceback.format_exception_only(exc)).strip()
                results[name] = f"failed: {detail}\n{traceback.format_exc()[-3000:]}"
            else:
                results[name] = "ok"
    print(json.dumps({"held": held, "services": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
