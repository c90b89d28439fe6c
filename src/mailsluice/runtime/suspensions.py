"""The operator's suspensions: a tenant, a destination or a source address, for a while.

Made through the admin API (``POST /api/suspensions``, ``mailsluice ctl suspend``), kept
in ``suspensions.json`` beside the state file (``destinations.json``), so they survive a
reload and a restart, each with its expiry (an expired one is dropped when read).

The file is also the channel between processes: with ``--workers N`` the admin server
runs in the helper process and writes it; every worker (and the broker, where the
scheduler runs) reads it again when its modification time changed, looked at no more than
once a second (``RECHECK``). No socket, no message to lose; a worker restarted reads it at
start. Written whole to a temporary file and renamed, so a reader never sees half.

What a suspension does:

* ``tenant`` (a ``[[tenants]]`` group name, or a client address): its new sessions are
  refused at the greeting (``421 4.7.0``) and, under fair sharing, its new transactions in
  sessions already open are declined by the scheduler (``451 4.7.0``: ``ServerDeclined``);
* ``destination`` (an MX address, ``192.0.2.7`` or ``192.0.2.7:25``): the same for
  sessions and transactions to it;
* ``source`` (an outbound address of ``[[source_addresses]]``): out of its pools, as a
  reputation penalty takes it out (``SourceSelector.suspended``).

The text says who and until when: ``tenant shop suspended by the operator until
14:05:09 UTC: flood``.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from mailsluice.settings.logplace import state_path

if TYPE_CHECKING:
    from mailsluice.settings.config import Settings

__all__ = [
    "KINDS", "FILE_NAME", "Suspension", "SuspensionError", "Suspensions", "Targets",
    "suspensions_of",
]  # fmt: skip

log = logging.getLogger("mailsluice.suspensions")

Kind = Literal["tenant", "destination", "source"]
KINDS: tuple[Kind, ...] = ("tenant", "destination", "source")
FILE_NAME = "suspensions.json"
RECHECK = 1.0  # seconds between two looks at the file's modification time
MAX_SECONDS = 30 * 86400.0  # a suspension lasts at most 30 days
MAX_ACTIVE = 1000
MAX_TEXT = 200  # characters of a name or a reason


class SuspensionError(ValueError):
    """A request that cannot be a suspension (the message says why)."""


@dataclass(frozen=True, slots=True)
class Suspension:
    id: str
    kind: Kind
    name: str
    until: float  # epoch seconds
    reason: str
    created: float

    def text(self) -> str:
        """What a refused client reads."""
        when = time.strftime("%H:%M:%S", time.gmtime(self.until))
        why = f": {self.reason}" if self.reason else ""
        return f"{self.kind} {self.name} suspended by the operator until {when} UTC{why}"

    def as_json(self, now: float) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        out["seconds_left"] = round(max(0.0, self.until - now), 1)
        out["text"] = self.text()
        return out


def _clean(value: object, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value.strip() and not empty):
        raise SuspensionError(f"{what}: a non-empty string is needed")
    text = value.strip()
    if len(text) > MAX_TEXT or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise SuspensionError(f"{what}: at most {MAX_TEXT} printable characters")
    return text


def _plain(host: str) -> str:
    return host.strip("[]").removeprefix("::ffff:")


def destination_matches(name: str, host: str, port: int) -> bool:
    """``name`` (``host`` or ``host:port``, IPv6 in brackets with a port) names this MX."""
    name = name.strip()
    if name.startswith("["):
        inner, _, rest = name[1:].partition("]")
        return _plain(inner) == _plain(host) and (not rest or rest == f":{port}")
    if name.count(":") == 1:
        only, _, wanted = name.partition(":")
        return only == _plain(host) and wanted == str(port)
    return _plain(name) == _plain(host)


@dataclass(frozen=True, slots=True)
class Targets:
    """What a suspension may name: the ``[[tenants]]`` groups (and which group a client
    address is in), this proxy's source addresses (``outbound_ip``, ``[[source_addresses]]``)."""

    groups: tuple[str, ...] = ()
    tenant_of: Callable[[str], str] = field(default=lambda ip: ip)
    sources: tuple[str, ...] = ()

    def name(self, kind: object, name: object) -> str:
        """``name`` as a suspension of ``kind`` keeps it (an address in its canonical
        form); ``SuspensionError`` when it would match nothing, saying what exists."""
        text = _clean(name, "name")
        if kind == "tenant":
            return self._tenant(text)
        if kind == "destination":
            return _destination(text)
        if kind == "source":
            return self._source(text)
        return text  # (the kind is refused by ``add``)

    def _tenant(self, text: str) -> str:
        if text in self.groups:
            return text
        groups = ", ".join(sorted(self.groups)) or "none configured"
        try:
            address = str(ipaddress.ip_address(text.strip("[]")))
        except ValueError:
            raise SuspensionError(
                f"tenant {text}: no [[tenants]] group has this name ({groups}), and it is "
                "not a client address either; give a group's name or a client's address"
            ) from None
        group = self.tenant_of(address)
        if group != address:
            raise SuspensionError(
                f"tenant {text}: this client is in the [[tenants]] group {group}, which its "
                f"sessions count as: suspend the group (tenant {group})"
            )
        return address

    def _source(self, text: str) -> str:
        try:
            address = str(ipaddress.ip_address(text.strip("[]")))
        except ValueError:
            address = text
        if address in self.sources:
            return address
        if not self.sources:
            raise SuspensionError(
                f"source {text}: this proxy has no source address of its own (outbound_ip "
                "and [[source_addresses]] are unset: the kernel chooses), so there is "
                "nothing to suspend; suspend a tenant or a destination instead"
            )
        raise SuspensionError(
            f"source {text}: not one of this proxy's source addresses "
            f"({', '.join(self.sources)}: outbound_ip, [[source_addresses]])"
        )


def _destination(text: str) -> str:
    """An MX address, with or without a port: ``192.0.2.7``, ``192.0.2.7:25``,
    ``2001:db8::7``, ``[2001:db8::7]:25``."""
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") else ("x" if rest else "")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is None or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise SuspensionError(
            f"destination {text}: an MX address is needed, with or without its port: "
            "192.0.2.7, 192.0.2.7:25, 2001:db8::7 or [2001:db8::7]:25 (mailsluice "
            "destinations and mailsluice ctl sessions show those in use)"
        )
    if not port:
        return str(address)
    return f"[{address}]:{int(port)}" if address.version == 6 else f"{address}:{int(port)}"


class Suspensions:
    """The suspensions in force, kept in ``path`` (None: in memory only)."""

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._clock = clock
        self._all: dict[str, Suspension] = {}
        self._mtime: int | None = None
        self._looked = float("-inf")
        self.reload()

    @property
    def path(self) -> Path | None:
        """Where they are kept (``runtime.fleet.suspensions`` shares it with the fleet)."""
        return self._path

    @classmethod
    def beside(cls, state: Path | None) -> Suspensions:
        """The suspensions kept beside the state file ``state`` (None: in memory)."""
        return cls(state.parent / FILE_NAME if state is not None else None)

    # ------------------------------------------------------------ reading
    def reload(self) -> None:
        """Read the file again (a missing file: none; a broken one: said, none kept)."""
        path = self._path
        if path is None:
            return
        try:
            stat = path.stat()
        except FileNotFoundError:
            self._all, self._mtime = {}, None
            return
        except OSError as exc:
            log.warning("suspensions: cannot read %s: %s", path, exc)
            return
        if stat.st_mtime_ns == self._mtime:
            return
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
            found = {row["id"]: Suspension(**row) for row in rows}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("suspensions: %s is not readable (%s): none apply", path, exc)
            found = {}
        self._all, self._mtime = found, stat.st_mtime_ns

    def _fresh(self) -> None:
        now = time.monotonic()
        if now - self._looked >= RECHECK:
            self._looked = now
            self.reload()

    def active(self) -> list[Suspension]:
        self._fresh()
        now = self._clock()
        return sorted((s for s in self._all.values() if s.until > now), key=lambda s: s.until)

    def find(self, kind: Kind, matches: Callable[[str], bool]) -> Suspension | None:
        if self._path is not None:
            self._fresh()  # (at most every RECHECK seconds: a stat of the file)
        if not self._all:  # none: the usual case, asked once per connection
            return None
        for suspension in self.active():
            if suspension.kind == kind and matches(suspension.name):
                return suspension
        return None

    def tenant(self, name: str) -> Suspension | None:
        return self.find("tenant", lambda n: n == name)

    def destination(self, host: str, port: int) -> Suspension | None:
        return self.find("destination", lambda n: destination_matches(n, host, port))

    def sources(self) -> dict[str, float]:
        """Source addresses suspended now: address -> until."""
        return {_plain(s.name): s.until for s in self.active() if s.kind == "source"}

    # ------------------------------------------------------------ changing
    def add(
        self,
        kind: object,
        name: object,
        seconds: object,
        reason: object,
        targets: Targets | None = None,
    ) -> Suspension:
        """A new suspension (``SuspensionError`` says what is wrong with the request).
        ``targets``: what exists to suspend (a name that would match nothing is refused)."""
        if kind not in KINDS:
            raise SuspensionError(f"kind: one of {', '.join(KINDS)}")
        if targets is not None:
            name = targets.name(kind, name)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise SuspensionError("seconds: a number of seconds is needed")
        if not 0 < seconds <= MAX_SECONDS:
            raise SuspensionError(f"seconds: more than 0, at most {MAX_SECONDS:.0f} (30 days)")
        self.reload()
        if len(self.active()) >= MAX_ACTIVE:
            raise SuspensionError(f"at most {MAX_ACTIVE} suspensions at once")
        now = self._clock()
        suspension = Suspension(
            id=secrets.token_hex(4),
            kind=kind,
            name=_clean(name, "name"),
            until=round(now + float(seconds), 3),
            reason=_clean(reason if reason is not None else "", "reason", empty=True),
            created=round(now, 3),
        )
        self._all[suspension.id] = suspension
        self._save()
        log.warning("suspension %s: %s", suspension.id, suspension.text())
        return suspension

    def remove(self, ident: str) -> Suspension | None:
        """Resume: the suspension ``ident`` ends now (None: there is no such one)."""
        self.reload()
        suspension = self._all.pop(ident, None)
        if suspension is not None:
            self._save()
            log.warning("suspension %s ended by the operator: %s", ident, suspension.text())
        return suspension

    def _save(self) -> None:
        now = self._clock()
        self._all = {k: s for k, s in self._all.items() if s.until > now}
        path = self._path
        if path is None:
            return
        rows = [asdict(s) for s in self._all.values()]
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
        os.replace(temporary, path)
        self._mtime = path.stat().st_mtime_ns

    # ------------------------------------------------------------ where they apply
    def refusal_text(self, tenant: str, host: str, port: int) -> str | None:
        """Why a session or transaction of ``tenant`` to the MX ``host:port`` may not go
        now (None: it may). ``tenant`` may be the scheduler's ``tenant@worker``."""
        if self._path is not None:
            self._fresh()  # (at most every RECHECK seconds: a stat of the file)
        if not self._all:  # none: the usual case, asked per connection and per transaction
            return None
        found = self.tenant(tenant.rpartition("@")[0] or tenant) or self.destination(host, port)
        return found.text() if found is not None else None

    def declines(self, key: tuple[str, str, int], tenant: str) -> str | None:
        """The scheduler's question (``LocalScheduler.operator_pause``)."""
        return self.refusal_text(tenant, key[1], key[2])


def suspensions_of(settings: Settings) -> Suspensions:
    """The suspensions kept beside the state file (every process reads the same)."""
    return Suspensions.beside(state_path(settings.state_file, settings.log))
