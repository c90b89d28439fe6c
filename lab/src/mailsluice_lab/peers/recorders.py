"""The demo's two peers: a recording MX (aiosmtpd) and an smtplib client.

Used by ``mailsluice demo`` and by the system tests, in-process or as processes
inside network namespaces.

The MX:

It accepts mail for everyone except the ``reject`` addresses (``550 5.1.1``, so the
demo can show an MX's real refusal reaching the client through the proxy) and
stores each message it accepts in ``maildir`` as ``NNNN.eml`` (the exact bytes it
received, dot-unstuffed) next to ``NNNN.json`` (envelope, peer and HELO). Every
accepted TCP connection is appended to ``maildir/connections.log``, so a test can
prove that no connection reached the MX. Files appear atomically (written, then
renamed). Never used to relay: it only stores.

Run in-process with :func:`start_mx`, or as a process (inside a network namespace)::

    python -m mailsluice.demo_peers mx --listen 0.0.0.0:25 --listen [::]:25 --maildir DIR

The client (:func:`send`) sends one message with smtplib and reports every reply
code that mattered; ``python -m mailsluice.demo_peers send ...`` prints it as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import os
import signal
import smtplib
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CONNECTIONS_LOG = "connections.log"


@dataclass(frozen=True, slots=True)
class Received:
    """One stored message, as read back by :func:`read_maildir`."""

    name: str
    content: bytes
    mail_from: str
    rcpt_tos: tuple[str, ...]
    peer: str
    helo: str | None


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@dataclass(slots=True)
class RecordingHandler:
    """aiosmtpd handler: refuses the ``reject`` recipients, stores everything else."""

    maildir: Path
    reject: frozenset[str] = frozenset()
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        if address.lower() in self.reject:
            return f"550 5.1.1 <{address}>: recipient rejected by the demo MX"
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.original_content
        if content is None:
            raw = envelope.content
            content = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
        name = f"{next(self._seq):04d}"
        meta = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": list(envelope.rcpt_tos),
            "peer": _peer_text(session.peer),
            "helo": session.host_name,
        }
        _write_atomically(self.maildir / f"{name}.eml", content or b"")
        _write_atomically(self.maildir / f"{name}.json", json.dumps(meta).encode())
        return f"250 2.0.0 Ok: queued as {name}"


def _peer_text(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


def demo_tls_context(directory: Path, hostname: str) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate, so the demo MX offers
    STARTTLS like real ones do (mailsluice records it as not verified)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "mx-cert.pem", directory / "mx-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    return context


class RecordingSMTP(SMTP):
    """aiosmtpd's server protocol, plus a line in ``connections.log`` per connection."""

    def __init__(
        self, handler: RecordingHandler, hostname: str, tls: ssl.SSLContext | None = None
    ) -> None:
        super().__init__(
            handler,
            hostname=hostname,
            decode_data=False,
            ident="demo MX",
            tls_context=tls,
            require_starttls=False,
        )
        self._log_path = handler.maildir / CONNECTIONS_LOG
        self._logged = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._logged:  # aiosmtpd calls this again after STARTTLS: one line per TCP
            self._logged = True
            with self._log_path.open("a", encoding="utf-8") as out:
                out.write(_peer_text(transport.get_extra_info("peername")) + "\n")
        super().connection_made(transport)


def _prepare(maildir: Path) -> None:
    maildir.mkdir(parents=True, exist_ok=True)
    (maildir / CONNECTIONS_LOG).touch()


async def start_mx(
    hosts: str | Sequence[str],
    port: int,
    maildir: Path,
    *,
    reject: Iterable[str] = (),
    hostname: str = "mx.demo.invalid",
) -> asyncio.Server:
    """Start listening (``port`` 0 picks a free one); the caller closes the server."""
    _prepare(maildir)
    handler = RecordingHandler(maildir, frozenset(a.lower() for a in reject))
    tls = demo_tls_context(maildir, hostname)
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: RecordingSMTP(handler, hostname, tls), host=hosts, port=port, reuse_address=True
    )


def read_maildir(maildir: Path) -> list[Received]:
    """The messages stored so far, oldest first."""
    out: list[Received] = []
    for eml in sorted(maildir.glob("[0-9]*.eml")):
        meta = json.loads(eml.with_suffix(".json").read_text(encoding="utf-8"))
        out.append(
            Received(
                name=eml.stem,
                content=eml.read_bytes(),
                mail_from=meta["mail_from"],
                rcpt_tos=tuple(meta["rcpt_tos"]),
                peer=meta["peer"],
                helo=meta["helo"],
            )
        )
    return out


def read_connections(maildir: Path) -> list[str]:
    """``host:port`` of every connection the MX accepted so far."""
    path = maildir / CONNECTIONS_LOG
    return path.read_text(encoding="utf-8").split() if path.exists() else []


@dataclass(frozen=True, slots=True)
class SendResult:
    """What the client saw: accepted, refused recipients, or the reply that stopped it."""

    accepted: bool  # the message got 2xx to end-of-data
    refused: dict[str, tuple[int, str]]  # recipient -> (code, text) when refused
    code: int | None = None  # the reply that ended the attempt, when it failed
    text: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SendResult:
        refused = {str(k): (int(v[0]), str(v[1])) for k, v in data["refused"].items()}
        return cls(bool(data["accepted"]), refused, data["code"], data["text"])

    def describe(self) -> str:
        """One line for people: what happened to the message."""
        if self.accepted and not self.refused:
            return "accepted (the MX said 2xx to end-of-data)"
        refusals = "; ".join(f"{r}: {c} {t}" for r, (c, t) in self.refused.items())
        if self.accepted:
            return f"accepted for some recipients; refused {refusals}"
        if self.refused:
            return f"refused: {refusals}"
        code = f"{self.code} " if self.code is not None else ""
        return f"failed: {code}{self.text or ''}"


def send(
    host: str,
    port: int,
    mail_from: str,
    rcpt_to: Sequence[str],
    message: bytes,
    *,
    source: str | None = None,
    timeout: float = 30.0,
    helo: str = "msa.demo.invalid",
) -> SendResult:
    """Send one message with smtplib (blocking; run it in a thread from async code)."""
    try:
        with smtplib.SMTP(
            host,
            port,
            local_hostname=helo,
            timeout=timeout,
            source_address=(source, 0) if source else None,
        ) as client:
            refused = client.sendmail(mail_from, list(rcpt_to), message)
    except smtplib.SMTPRecipientsRefused as exc:
        return SendResult(False, _refusals(exc.recipients))
    except smtplib.SMTPResponseException as exc:
        return SendResult(False, {}, exc.smtp_code, _text(exc.smtp_error))
    except (smtplib.SMTPException, OSError) as exc:
        return SendResult(False, {}, None, f"{type(exc).__name__}: {exc}")
    return SendResult(True, _refusals(refused))


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def _refusals(raw: dict[str, tuple[int, bytes]]) -> dict[str, tuple[int, str]]:
    return {rcpt: (code, _text(text)) for rcpt, (code, text) in raw.items()}


def _split_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (e.g. 0.0.0.0:25, [::]:25)")
    return host, int(port)


async def _serve(listen: list[tuple[str, int]], maildir: Path, reject: list[str]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    servers = [await start_mx(host, port, maildir, reject=reject) for host, port in listen]
    try:
        await stop.wait()
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mailsluice.demo_peers", description=__doc__)
    sub = parser.add_subparsers(dest="role", required=True)
    mx = sub.add_parser("mx", help="run the recording MX until SIGTERM")
    mx.add_argument("--listen", action="append", type=_split_listen, required=True)
    mx.add_argument("--maildir", type=Path, required=True)
    mx.add_argument("--reject", action="append", default=[], metavar="ADDRESS")
    client = sub.add_parser("send", help="send one message, print the outcome as JSON")
    client.add_argument("--server", type=_split_listen, required=True)
    client.add_argument("--source", help="source address to bind")
    client.add_argument("--from", dest="mail_from", required=True)
    client.add_argument("--to", action="append", required=True)
    client.add_argument("--message-file", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.role == "mx":
        asyncio.run(_serve(args.listen, args.maildir, args.reject))
        return 0
    host, port = args.server
    result = send(
        host, port, args.mail_from, args.to, args.message_file.read_bytes(), source=args.source
    )
    print(json.dumps(asdict(result)))
    return 0 if result.accepted else 1


if __name__ == "__main__":
    raise SystemExit(main())
