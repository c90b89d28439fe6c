"""A local DNS responder for the tests (dnspython), on a free loopback port, UDP and TCP.

It answers from records the test gives (``add``), authoritative-style: the records of
the name and type asked, NODATA when the name has other types only, NXDOMAIN when it has
none. Per-name switches: ``secure`` (answer with AD set, as a validating resolver does
for signed data; the default is AD clear), ``servfail`` (SERVFAIL, as a validating
resolver answers bogus data) and ``silent`` (never answer: the client times out). Every
question is recorded in ``queries``. One thread serves both sockets until ``stop``.

    with DnsServer() as dns:
        dns.add("example.org", "MX", "10 mx.example.org.")
        dns.secure.add("example.org")
        resolver = f"127.0.0.1:{dns.port}"
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from collections import defaultdict
from types import TracebackType

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

_READ_DEADLINE = 2.0  # seconds a TCP client gets to send its query


class DnsServer:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.records: dict[str, dict[str, list[tuple[int, str]]]] = defaultdict(dict)
        self.secure: set[str] = set()
        self.servfail: set[str] = set()
        self.silent: set[str] = set()
        self.queries: list[tuple[str, str]] = []
        self._udp, self._tcp = _bind_pair(host)
        self.port: int = self._udp.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="test-dns", daemon=True)

    @property
    def address(self) -> str:
        """The ``tls_policy.resolver`` value that reaches this server."""
        return f"{self.host}:{self.port}"

    def add(self, name: str, rdtype: str, *rdatas: str, ttl: int = 300) -> None:
        """Records of ``name`` (absolute or not; lower-cased) in presentation form."""
        self.records[_key(name)].setdefault(rdtype.upper(), []).extend(
            (ttl, rdata) for rdata in rdatas
        )

    def asked(self, name: str, rdtype: str) -> int:
        return self.queries.count((_key(name), rdtype.upper()))

    def start(self) -> DnsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._udp.close()
        self._tcp.close()

    def __enter__(self) -> DnsServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def answer(self, wire: bytes) -> bytes | None:
        """The response to one query (None: stay silent)."""
        try:
            query = dns.message.from_wire(wire)
        except Exception:
            return None
        if not query.question:
            return None
        question = query.question[0]
        name = _key(question.name.to_text())
        rdtype = dns.rdatatype.to_text(question.rdtype)
        self.queries.append((name, rdtype))
        if name in self.silent:
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA | dns.flags.RA
        if name in self.servfail:
            response.set_rcode(dns.rcode.SERVFAIL)
            return response.to_wire()
        if name in self.secure:
            response.flags |= dns.flags.AD
        types = self.records.get(name)
        if not types:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif rdtype in types:
            entries = types[rdtype]
            texts = [rdata for _, rdata in entries]
            rrset = dns.rrset.from_text(
                question.name, entries[0][0], dns.rdataclass.IN, rdtype, *texts
            )
            response.answer.append(rrset)
        return response.to_wire()

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._udp, self._tcp], [], [], 0.05)
            for sock in ready:
                if sock is self._udp:
                    try:
                        wire, peer = self._udp.recvfrom(65535)
                        reply = self.answer(wire)
                        if reply is not None:
                            self._udp.sendto(reply, peer)
                    except OSError:
                        continue
                else:
                    self._serve_tcp()

    def _serve_tcp(self) -> None:
        conn, _ = self._tcp.accept()
        with conn:
            conn.settimeout(_READ_DEADLINE)
            try:
                head = _read_exactly(conn, 2)
                (length,) = struct.unpack("!H", head)
                reply = self.answer(_read_exactly(conn, length))
                if reply is not None:
                    conn.sendall(struct.pack("!H", len(reply)) + reply)
            except (OSError, ValueError):
                return


def _bind_pair(host: str) -> tuple[socket.socket, socket.socket]:
    """A UDP and a TCP socket on the same free port (a few tries: the TCP port of a free
    UDP port may be taken)."""
    for _ in range(20):
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((host, 0))
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            tcp.bind((host, udp.getsockname()[1]))
        except OSError:
            udp.close()
            tcp.close()
            continue
        tcp.listen(16)
        return udp, tcp
    raise OSError("no free port for both UDP and TCP")


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ValueError("the client closed early")
        data += chunk
    return data


def _key(name: str) -> str:
    return name.lower().rstrip(".")
