"""A minimal DNS responder for the MTA-STS and TLS report tests (dnspython, UDP on
loopback): it answers from a table of records, NXDOMAIN for names it does not know,
NOERROR with no answer for a known name without that type, SERVFAIL for names listed in
``servfail``. Change ``records`` at any time; ``queries`` counts what was asked."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import TracebackType

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class DnsResponder(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        # (name, type) -> rdata texts, e.g. ("_mta-sts.example.test", "TXT"): ['"v=STSv1; id=1"']
        self.records: dict[tuple[str, str], list[str]] = {}
        self.servfail: set[str] = set()
        self.queries: Counter[tuple[str, str]] = Counter()
        self._transport: asyncio.DatagramTransport | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def txt(self, name: str, *strings: str) -> None:
        """Add one TXT record made of ``strings`` (each quoted as one string)."""
        text = " ".join('"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"' for s in strings)
        self.records.setdefault((name.lower(), "TXT"), []).append(text)

    def a(self, name: str, address: str = "127.0.0.1") -> None:
        self.records.setdefault((name.lower(), "A"), []).append(address)

    async def __aenter__(self) -> DnsResponder:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: self, local_addr=("127.0.0.1", 0)
        )
        self.port = transport.get_extra_info("sockname")[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._transport is not None:
            self._transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            query = dns.message.from_wire(data)
        except Exception:
            return
        response = dns.message.make_response(query)
        response.flags |= dns.flags.RA
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        rdtype = dns.rdatatype.to_text(question.rdtype)
        self.queries[(name, rdtype)] += 1
        if name in self.servfail:
            response.set_rcode(dns.rcode.SERVFAIL)
        elif (name, rdtype) in self.records:
            response.answer.append(
                dns.rrset.from_text_list(
                    question.name, 60, "IN", rdtype, self.records[(name, rdtype)]
                )
            )
        elif not any(known == name for known, _ in self.records):
            response.set_rcode(dns.rcode.NXDOMAIN)
        assert self._transport is not None
        self._transport.sendto(response.to_wire(), addr)
