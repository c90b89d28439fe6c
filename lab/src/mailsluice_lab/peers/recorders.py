"""Records an MX keeps besides its ledger, on disk, for readers in other processes.

* :class:`MaildirRecorder` (the demo, the system tests): each message in ``maildir`` as
  ``NNNN.eml`` (the exact bytes, dot-unstuffed) next to ``NNNN.json`` (envelope, peer,
  HELO), and every accepted TCP connection as a line of ``maildir/connections.log``, so a
  test can prove that no connection reached the MX. Files appear atomically (written,
  then renamed). Read back with :func:`read_maildir` and :func:`read_connections`.
* :class:`DeliveryRecorder` (the scenario benchmarks): one CSV row per message,
  ``mx, tenant, message_id, sent_at, received_at, connection``; the tenant, the id and
  ``sent_at`` come from the ``X-Bench-Tenant``, ``X-Bench-Id`` and ``X-Bench-Sent`` headers
  the tenant put in, ``received_at`` is when the MX took the message, ``connection`` the
  number of the MX session that carried it. Rows are buffered and written by
  :meth:`DeliveryRecorder.flush`.
* :func:`write_connection_log`: the MX's connections (``ScriptedMX.connection_log``) as a
  CSV, ``mx, connection, client, opened_at, closed_at, outcome``.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from mailsluice_lab.peers.ledger import StoredMessage

CONNECTIONS_LOG = "connections.log"
DELIVERY_HEADER = ("mx", "tenant", "message_id", "sent_at", "received_at", "connection")
CONNECTION_HEADER = ("mx", "connection", "client", "opened_at", "closed_at", "outcome")


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


class MaildirRecorder:
    """Keeps what an MX took as files in ``maildir`` (created, with an empty connection log)."""

    def __init__(self, maildir: Path) -> None:
        self.maildir = maildir
        maildir.mkdir(parents=True, exist_ok=True)
        (maildir / CONNECTIONS_LOG).touch()

    def connection_accepted(self, peer: str) -> None:
        with (self.maildir / CONNECTIONS_LOG).open("a", encoding="utf-8") as out:
            out.write(peer + "\n")

    def message_stored(self, message: StoredMessage) -> None:
        name = f"{message.seq:04d}"
        meta = {
            "mail_from": message.mail_from,
            "rcpt_tos": list(message.rcpt_tos),
            "peer": message.peer,
            "helo": message.helo,
        }
        _write_atomically(self.maildir / f"{name}.eml", message.data)
        _write_atomically(self.maildir / f"{name}.json", json.dumps(meta).encode())


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


def bench_headers(head: bytes) -> dict[str, str]:
    """The ``X-Bench-*`` header fields of a message's header section (lower-cased names)."""
    fields: dict[str, str] = {}
    for raw in head.split(b"\r\n"):
        name, sep, value = raw.partition(b":")
        if sep and name.lower().startswith(b"x-bench-"):
            fields[name.decode("ascii", "replace").lower()] = value.strip().decode(
                "ascii", "replace"
            )
    return fields


class DeliveryRecorder:
    """The delivery CSV of one MX; ``flush`` writes the buffered rows (``close`` too)."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.file: TextIO = path.open("w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(DELIVERY_HEADER)
        self.rows: list[tuple[str, ...]] = []
        self.count = 0

    def connection_accepted(self, peer: str) -> None:
        pass  # the MX's stats count connections

    def message_stored(self, message: StoredMessage) -> None:
        self.count += 1
        end = message.data.find(b"\r\n\r\n")
        fields = bench_headers(message.data if end < 0 else message.data[:end])
        self.rows.append((
            self.name,
            fields.get("x-bench-tenant", ""),
            fields.get("x-bench-id", f"unknown-{self.name}-{self.count}"),
            fields.get("x-bench-sent", ""),
            f"{message.stored_at:.6f}",
            str(message.connection),
        ))  # fmt: skip

    def flush(self) -> None:
        if self.rows:
            self.writer.writerows(self.rows)
            self.rows.clear()
        self.file.flush()

    def close(self) -> None:
        self.flush()
        self.file.close()


class LoggedConnection(Protocol):
    """What :func:`write_connection_log` reads of a connection (``mx.ConnectionEntry``)."""

    @property
    def number(self) -> int: ...
    @property
    def client(self) -> str: ...
    @property
    def opened_at(self) -> float: ...
    @property
    def closed_at(self) -> float | None: ...
    @property
    def outcome(self) -> str: ...


def write_connection_log(
    path: Path, name: str, entries: Iterable[LoggedConnection], *, now: float
) -> None:
    """The connections of MX ``name`` as a CSV; one still open ends at ``now``."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CONNECTION_HEADER)
        for e in entries:
            closed = now if e.closed_at is None else e.closed_at
            writer.writerow((name, e.number, e.client, f"{e.opened_at:.6f}", f"{closed:.6f}",
                             e.outcome))  # fmt: skip
