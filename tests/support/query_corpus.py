"""Sessions built to tell the filters of ``mailsluice sessions`` apart, and what each
filter must find among them (the same on every backend)."""

from __future__ import annotations

from dataclasses import dataclass

from mailsluice.relay.records import Record, SessionClosed, SessionOpened, TransactionEnded
from mailsluice.sessionlog.cli_commands import build_filter
from mailsluice.sessionlog.query import SessionFilter

T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z
NOW = T0 + 4 * 3600  # the "now" of relative times: 16:00


def _opened(sid: str, at: float, client: str, destination: str) -> SessionOpened:
    return SessionOpened(
        session_id=sid, at=at, client=client, destination=destination, source_ip=None
    )


def _closed(sid: str, at: float, final: int, tls: bool) -> SessionClosed:
    return SessionClosed(
        session_id=sid, at=at, helo="msa.example", tls_version="TLSv1.3" if tls else None,
        tls_cipher="TLS_AES_128_GCM_SHA256" if tls else None, tls_verified=True if tls else None,
        messages=1, bytes=100, final_code=final, connect_to_354_ms=5.0, reason="quit",
    )  # fmt: skip


def _txn(
    sid: str, seq: int, at: float, sender: str, rcpts: tuple[str, ...], code: int | None
) -> TransactionEnded:
    return TransactionEnded(
        session_id=sid, seq=seq, started_at=at, ended_at=at + 1, mail_from=sender,
        rcpt_to=rcpts, accepted_rcpt_to=rcpts, size=100, reply_code=code,
        reply_text=None, outcome="delivered" if code == 250 else "rejected",
    )  # fmt: skip


def records() -> list[Record]:
    """s1..s7; comments say what each is there to tell apart."""
    return [
        # TLS, a mixed-case sender, two recipients, delivered
        _opened("s1", T0, "192.0.2.10:41000", "198.51.100.25:25"),
        _txn("s1", 1, T0 + 1, "Alice@Example.COM", ("bob@example.org", "carol@other.example"), 250),
        _closed("s1", T0 + 10, 221, tls=True),
        # IPv6 both ends, the null sender, refused, no TLS
        _opened("s2", T0 + 3600, "[2001:db8::5]:40000", "[2001:db8::25]:25"),
        _txn("s2", 1, T0 + 3601, "", ("postmaster@example.org",), 550),
        _closed("s2", T0 + 3610, 221, tls=False),
        # a client whose address starts like s1's (192.0.2.100), two transactions, 451 then 250
        _opened("s3", T0 + 7200, "192.0.2.100:5000", "198.51.100.25:587"),
        _txn("s3", 1, T0 + 7201, "x@example.org", ("dave@example.net",), 451),
        _txn("s3", 2, T0 + 7202, "y@Sub.Example.org", ("erin@example.net",), 250),
        _closed("s3", T0 + 7210, 421, tls=True),
        # still open: TLS unknown
        _opened("s4", T0 + 10800, "192.0.2.10:41001", "198.51.100.26:25"),
        # its opening record was lost: no start, no client; refused at the end
        _closed("s5", T0 + 60, 554, tls=False),
        # LIKE's wildcards, a non-ASCII capital, a trailing space, a subdomain sender
        _opened("s6", T0 + 1800, "192.0.2.7:2525", "mx.example:25"),
        _txn(
            "s6",
            1,
            T0 + 1801,
            "z@sub.example.org",
            ("aXbYc@example.org", "Ünïcode@example.org", "space@example.org "),
            None,
        ),
        _closed("s6", T0 + 1810, 251, tls=False),  # 251: next to 250
        # LIKE's wildcards for real, and the escape character itself
        _opened("s7", T0 + 1900, "192.0.2.8:2525", "198.51.100.25:25"),
        _txn("s7", 1, T0 + 1901, "a_b%c!d@example.org", ("a_b%c@example.org",), 250),
        _closed("s7", T0 + 1910, 221, tls=False),
    ]


@dataclass(frozen=True)
class Case:
    """Options as typed on the command line, and the ids they must list, newest first."""

    options: dict[str, str]
    expected: tuple[str, ...]
    limit: int = 0

    @property
    def where(self) -> SessionFilter:
        return build_filter(now=NOW, **self.options)

    def __str__(self) -> str:
        return " ".join(f"--{k} {v!r}" for k, v in self.options.items()) or "(no filter)"


ALL = ("s4", "s3", "s2", "s7", "s6", "s1", "s5")  # newest first; s5 has no start: last
CASES = [
    Case({}, ALL),
    Case({}, ("s4", "s3"), limit=2),
    Case({"since": "2024-05-01T13:00:00Z"}, ("s4", "s3", "s2")),
    Case({"since": "3h"}, ("s4", "s3", "s2")),  # 13:00, the exact start of s2: included
    Case({"until": "2024-05-01T13:00"}, ("s7", "s6", "s1")),  # excluded: s2 at exactly 13:00
    Case(
        {"since": "2024-05-01T12:30Z", "until": "2024-05-01T14:30+00:00"}, ("s3", "s2", "s7", "s6")
    ),
    Case({"since": "2024-05-01T14:00:00+02:00"}, ALL[:-1]),  # 12:00 UTC: everything with a start
    Case({"client": "192.0.2.10"}, ("s4", "s1")),  # not 192.0.2.100
    Case({"client": "192.0.2.10:41000"}, ("s1",)),
    Case({"client": "2001:DB8::5"}, ("s2",)),
    Case({"client": "[2001:db8::5]:40000"}, ("s2",)),
    Case({"client": "[2001:db8::5]:4000"}, ()),
    Case({"destination": "198.51.100.25"}, ("s3", "s7", "s1")),
    Case({"destination": "198.51.100.25:587"}, ("s3",)),
    Case({"destination": "MX.example"}, ("s6",)),
    Case({"sender": "alice@example.com"}, ("s1",)),
    Case({"sender": "<ALICE@EXAMPLE.COM>"}, ("s1",)),
    Case({"sender": "<>"}, ("s2",)),
    Case({"sender": "@example.org"}, ("s3", "s7")),  # not z@sub.example.org
    Case({"sender": "@sub.example.org"}, ("s3", "s6")),
    Case({"sender": "a_b%c!d@example.org"}, ("s7",)),
    Case({"sender": "aXb%c!d@example.org"}, ()),  # _ is no wildcard
    Case({"recipient": "bob@example.org"}, ("s1",)),
    Case({"recipient": "@other.example"}, ("s1",)),
    Case({"recipient": "@EXAMPLE.NET"}, ("s3",)),
    Case({"recipient": "a_b%c@example.org"}, ("s7",)),  # not aXbYc@example.org
    Case({"recipient": "ünïcode@example.org"}, ()),  # only ASCII letters fold
    Case({"recipient": "Ünïcode@EXAMPLE.org"}, ("s6",)),
    Case({"recipient": "space@example.org"}, ()),  # the logged one ends with a space
    Case({"code": "250"}, ("s3", "s7", "s1")),
    Case({"code": "251"}, ("s6",)),  # its final code
    Case({"code": "5xx"}, ("s2", "s5")),
    Case({"code": "4xx"}, ("s3",)),
    Case({"code": "45x"}, ("s3",)),
    Case({"code": "221"}, ("s2", "s7", "s1")),
    Case({"code": "4xx,5xx"}, ("s3", "s2", "s5")),
    Case({"tls": "yes"}, ("s3", "s1")),
    Case({"tls": "no"}, ("s2", "s7", "s6", "s5")),  # not s4: still open
    Case({"client": "192.0.2.10", "tls": "yes"}, ("s1",)),
    Case({"code": "2xx", "sender": "@example.org"}, ("s3", "s7")),
    Case({"code": "2xx"}, ("s3", "s2"), limit=2),
]
