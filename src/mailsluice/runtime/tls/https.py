"""A small HTTPS client for MTA-STS policies and TLS reports: HTTP/1.1 with h11 over
``asyncio.open_connection``, one request per connection, no redirects ever followed.

Host names are resolved through the configured resolver (dnspython), never the
system's, so the policy host and the report endpoints are found the way the MX's
records are (and tests can point them at loopback). The certificate is verified for the
host name with the given context. The body is capped: a response that says or sends
more than ``max_body`` bytes is refused (``BodyTooLarge``). The caller sets the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.resolver
import h11

__all__ = [
    "BodyTooLarge",
    "HttpError",
    "HttpResponse",
    "https_request",
    "resolve_addresses",
    "tls_context",
]

READ_SIZE = 16_384


class HttpError(Exception):
    """The exchange failed (connection, protocol, name); the message says how."""


class BodyTooLarge(HttpError):
    """The response body is over the cap."""


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes  # empty unless the status is 2xx

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        for key, value in self.headers:
            if key == wanted:
                return value
        return None


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """A verifying client context: ``ca_file``'s anchors, else the system's."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def resolve_addresses(resolver: dns.asyncresolver.Resolver, host: str) -> list[str]:
    """The addresses of ``host`` (IPv4 first), or ``host`` itself if it is an address."""
    try:
        ipaddress.ip_address(host)
        return [host]
    except ValueError:
        pass
    found: list[str] = []
    problems: list[str] = []
    for rdtype in ("A", "AAAA"):
        try:
            answer = await resolver.resolve(host, rdtype)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            continue
        except dns.exception.DNSException as exc:
            problems.append(f"{rdtype}: {exc}")
            continue
        found.extend(rr.to_text() for rr in answer)
    if not found:
        why = "; ".join(problems) or "no address"
        raise HttpError(f"{host}: cannot resolve ({why})")
    return found


async def https_request(
    host: str,
    port: int,
    target: str,
    *,
    addresses: Sequence[str],
    context: ssl.SSLContext,
    method: str = "GET",
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
    max_body: int = 65_536,
) -> HttpResponse:
    """One request to ``https://host:port/target``, trying ``addresses`` in turn until one
    connects. Certificate errors (``ssl.SSLCertVerificationError``) are raised as they are."""
    problems: list[str] = []
    for address in addresses:
        try:
            reader, writer = await asyncio.open_connection(
                address, port, ssl=context, server_hostname=host
            )
        except ssl.SSLCertVerificationError:
            raise
        except OSError as exc:
            problems.append(f"{address}: {exc.strerror or exc}")
            continue
        try:
            return await _exchange(
                reader, writer, host, port, target, method, headers, body, max_body
            )
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()
    raise HttpError(f"{host}:{port}: cannot connect ({'; '.join(problems) or 'no address'})")


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    host: str,
    port: int,
    target: str,
    method: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    max_body: int,
) -> HttpResponse:
    connection = h11.Connection(our_role=h11.CLIENT)
    authority = host if port == 443 else f"{host}:{port}"
    request_headers = [("Host", authority), ("User-Agent", "mailsluice"), *headers]
    request_headers.append(("Connection", "close"))
    if method != "GET":
        request_headers.append(("Content-Length", str(len(body))))
    try:
        writer.write(connection.send(h11.Request(method=method, target=target,
                                                 headers=request_headers)) or b"")  # fmt: skip
        if body:
            writer.write(connection.send(h11.Data(data=body)) or b"")
        writer.write(connection.send(h11.EndOfMessage()) or b"")
        await writer.drain()
        response: h11.Response | None = None
        chunks: list[bytes] = []
        size = 0
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await reader.read(READ_SIZE))
            elif isinstance(event, h11.Response):
                response = event
                found = _headers(event)
                if not 200 <= event.status_code < 300:
                    return HttpResponse(event.status_code, found, b"")
                length = dict(found).get("content-length", "")
                if length.isdigit() and int(length) > max_body:
                    raise BodyTooLarge(f"the body is {length} bytes, over {max_body}")
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > max_body:
                    raise BodyTooLarge(f"the body is over {max_body} bytes")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return HttpResponse(response.status_code, _headers(response), b"".join(chunks))
            elif isinstance(event, h11.ConnectionClosed):
                raise HttpError("the server closed the connection before the end")
    except h11.ProtocolError as exc:
        raise HttpError(f"HTTP protocol error: {exc}") from None


def _headers(response: h11.Response) -> tuple[tuple[str, str], ...]:
    return tuple(
        (bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1"))
        for k, v in response.headers
    )
