"""The scenario's MX servers: SMTP sinks that record every message they accept.

One process (``python -m mailsluice.benchmark.scenarios.mx --spec JSON --out-dir DIR``),
started inside the MX namespace, serves every MX of a scenario, each on its own
address. Kinds (see :class:`MxSpec`):

* ``sink``: accepts everything at once;
* ``tarpit``: waits ``delay`` seconds before every reply (greeting included) and
  ``data_delay`` more before the reply to end-of-data, like an anti-spam throttle;
* ``limited``: at most ``limit`` concurrent connections per client address; above it
  the greeting is ``421 4.7.0`` and the connection is closed (Postfix's
  ``smtpd_client_connection_count_limit``).

Every accepted message becomes one CSV row in ``DIR/deliveries-<mx>.csv``:
``mx, tenant, message_id, sent_at, received_at``; ``sent_at``, the tenant and the id come
from the ``X-Bench-Sent``, ``X-Bench-Tenant`` and ``X-Bench-Id`` headers the tenant put
in, ``received_at`` is when the MX answered 250 to end-of-data. At exit,
``DIR/mx-stats.json`` gives per MX the sessions, the 421 refusals and the peak concurrent
connections per client. Bounded: every read has a deadline, lines and messages a size
cap, and the process exits after ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from mailsluice.benchmark.scenarios.aio import run, stop_event, wait_or_timeout

KINDS = ("sink", "tarpit", "limited")
READ_TIMEOUT = 120.0  # seconds a client may stay silent
LINE_LIMIT = 8192
MESSAGE_LIMIT = 10 * 1024 * 1024
CSV_HEADER = ("mx", "tenant", "message_id", "sent_at", "received_at")
STATS_NAME = "mx-stats.json"


@dataclass(frozen=True, slots=True)
class MxSpec:
    """One MX server: its name (the domain label), address, kind and its parameters."""

    name: str
    host: str
    port: int = 25
    kind: str = "sink"
    delay: float = 0.0  # tarpit: before every reply
    data_delay: float = 0.0  # tarpit: additionally before the end-of-data reply
    limit: int = 0  # limited: concurrent connections per client address

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"MX {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.delay < 0 or self.data_delay < 0 or self.limit < 0:
            raise ValueError(f"MX {self.name}: delays and limit must not be negative")


def specs_to_json(specs: list[MxSpec]) -> str:
    return json.dumps([asdict(spec) for spec in specs])


def specs_from_json(text: str) -> list[MxSpec]:
    return [MxSpec(**item) for item in json.loads(text)]


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


class Recorder:
    """Buffers CSV rows for one MX; ``flush`` writes them (called every 0.25 s)."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.file: TextIO = path.open("w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(CSV_HEADER)
        self.rows: list[tuple[str, ...]] = []
        self.count = 0

    def record(self, fields: dict[str, str], received_at: float) -> None:
        self.count += 1
        self.rows.append((
            self.name,
            fields.get("x-bench-tenant", ""),
            fields.get("x-bench-id", f"unknown-{self.name}-{self.count}"),
            fields.get("x-bench-sent", ""),
            f"{received_at:.6f}",
        ))  # fmt: skip

    def flush(self) -> None:
        if self.rows:
            self.writer.writerows(self.rows)
            self.rows.clear()
        self.file.flush()

    def close(self) -> None:
        self.flush()
        self.file.close()


class Mx:
    """The SMTP dialogue of one MX; ``session`` is the asyncio server's callback."""

    def __init__(self, spec: MxSpec, recorder: Recorder) -> None:
        self.spec = spec
        self.recorder = recorder
        self.active: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()  # the most concurrent connections per client
        self.connections = 0
        self.refused = 0
        self.queued = 0

    def stats(self) -> dict[str, object]:
        """What ends up in ``mx-stats.json``: sessions, 421 refusals, peak per client."""
        return {
            "connections": self.connections,
            "accepted_messages": self.queued,
            "refused_421": self.refused,
            "peak_connections_per_client": dict(sorted(self.peak.items())),
        }

    async def _reply(self, writer: asyncio.StreamWriter, text: str, extra: float = 0.0) -> None:
        delay = (self.spec.delay if self.spec.kind == "tarpit" else 0.0) + extra
        if delay > 0:
            await asyncio.sleep(delay)
        writer.write(text.encode("ascii") + b"\r\n")
        await writer.drain()

    async def session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str((writer.get_extra_info("peername") or ("?",))[0])
        try:
            if self.spec.kind == "limited" and self.active[peer] >= self.spec.limit:
                self.refused += 1
                writer.write(b"421 4.7.0 Error: too many connections from " + peer.encode()
                             + b"\r\n")  # fmt: skip
                await writer.drain()
                return
            self.active[peer] += 1
            self.connections += 1
            self.peak[peer] = max(self.peak[peer], self.active[peer])
            try:
                await self._dialogue(reader, writer)
            finally:
                self.active[peer] -= 1
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError):  # fmt: skip
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _line(self, reader: asyncio.StreamReader) -> bytes:
        async with asyncio.timeout(READ_TIMEOUT):
            line = await reader.readline()
        if not line:
            raise asyncio.IncompleteReadError(b"", None)
        return line

    async def _dialogue(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = f"{self.spec.name}.msb.test"
        await self._reply(writer, f"220 {name} ESMTP bench {self.spec.kind}")
        while True:
            line = await self._line(reader)
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                await self._reply(writer, f"250-{name}\r\n250-PIPELINING\r\n250-SIZE "
                                  f"{MESSAGE_LIMIT}\r\n250 8BITMIME")  # fmt: skip
            elif verb == b"MAIL":
                await self._reply(writer, "250 2.1.0 Ok")
            elif verb == b"RCPT":
                await self._reply(writer, "250 2.1.5 Ok")
            elif verb == b"DATA":
                await self._reply(writer, "354 End data with <CR><LF>.<CR><LF>")
                await self._data(reader, writer)
            elif verb in (b"RSET", b"NOOP"):
                await self._reply(writer, "250 2.0.0 Ok")
            elif verb == b"QUIT":
                await self._reply(writer, "221 2.0.0 Bye")
                return
            else:
                await self._reply(writer, "502 5.5.2 Error: command not recognized")

    async def _data(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head: list[bytes] = []
        in_head = True
        size = 0
        while True:
            line = await self._line(reader)
            if line in (b".\r\n", b".\n"):
                break
            size += len(line)
            if in_head:
                if line in (b"\r\n", b"\n"):
                    in_head = False
                else:
                    head.append(line)
        if size > MESSAGE_LIMIT:
            await self._reply(writer, "552 5.3.4 Error: message too big")
            return
        fields = bench_headers(b"\r\n".join(line.rstrip(b"\r\n") for line in head))
        extra = self.spec.data_delay if self.spec.kind == "tarpit" else 0.0
        delay = (self.spec.delay if self.spec.kind == "tarpit" else 0.0) + extra
        if delay > 0:
            await asyncio.sleep(delay)
        self.queued += 1
        self.recorder.record(fields, time.time())
        writer.write(f"250 2.0.0 Ok: queued as {self.spec.name}-{self.queued}\r\n".encode())
        await writer.drain()


async def serve(specs: list[MxSpec], out_dir: Path, max_seconds: float) -> int:
    """Serve every MX until SIGTERM/SIGINT or ``max_seconds``; write the CSVs; return 0."""
    stop = stop_event()
    recorders = [Recorder(spec.name, out_dir / f"deliveries-{spec.name}.csv") for spec in specs]
    servers: list[asyncio.Server] = []
    mxes: list[Mx] = []
    try:
        for spec, recorder in zip(specs, recorders, strict=True):
            mx = Mx(spec, recorder)
            mxes.append(mx)
            servers.append(await asyncio.start_server(
                mx.session, spec.host, spec.port, backlog=1024, limit=LINE_LIMIT,
                reuse_address=True,
            ))  # fmt: skip
        (out_dir / "mx-ready").write_text(json.dumps([s.name for s in specs]) + "\n")
        deadline = time.monotonic() + max_seconds
        while time.monotonic() < deadline:
            if await wait_or_timeout(stop, min(0.25, deadline - time.monotonic())):
                break
            for recorder in recorders:
                recorder.flush()
    finally:
        for server in servers:
            server.close()
        for recorder in recorders:
            recorder.close()
        (out_dir / STATS_NAME).write_text(json.dumps({mx.spec.name: mx.stats() for mx in mxes}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mailsluice.benchmark.scenarios.mx")
    parser.add_argument("--spec", required=True, help="JSON list of MxSpec fields")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    args = parser.parse_args(argv)
    try:
        specs = specs_from_json(args.spec)
    except (ValueError, TypeError) as exc:
        print(f"mx: bad --spec: {exc}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    return run(serve(specs, args.out_dir, args.max_seconds))


if __name__ == "__main__":
    raise SystemExit(main())
