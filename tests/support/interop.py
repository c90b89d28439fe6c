"""The real-MTA interop matrix: the probe messages, the per-message verdicts, the table.

A *probe* is one message a tenant MTA sends through mailsluice to the Postfix MX
(``tests.support.postfix_mx``): a unique token in its Message-ID, one of the body
*kinds* below, one MX listener (which EHLO keywords the MX offers) and one delivery
*mode* (a connection per message, or several transactions on one connection). Each
MTA adapter turns its own log into ``Confirmation``s (what the MTA believes happened to
each recipient); ``judge`` sets them against what the MX stored and says, per probe,
how many copies each recipient got, whether the body is byte-identical, and what went
wrong. ``rows`` folds the verdicts into the matrix (MTA x option: delivered, duplicates,
deferrals) and ``render`` prints it as Markdown.

With ``MAILSLUICE_INTEROP_REPORT=FILE`` the system tests append their rows to FILE (JSON
lines) before asserting, so a run against a faulty proxy still yields its figures:

    MAILSLUICE_INTEROP_REPORT=/tmp/interop.jsonl pytest tests/system/test_interop_mtas.py
    python -m tests.support.interop /tmp/interop.jsonl  # --long: one line per cell
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.support.postfix_mx import StoredMessage, split_message

REPORT_ENV = "MAILSLUICE_INTEROP_REPORT"
SENDER_DOMAIN = "tenant.example"

#: MX listeners: domain -> (address, EHLO keywords that listener hides). The first is the
#: MX as Postfix ships (PIPELINING and CHUNKING offered, and STARTTLS), the other two hide
#: one keyword each.
MX_LISTENERS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "mx-default.example": ("10.251.2.2", ()),
    "mx-nopipelining.example": ("10.251.2.4", ("pipelining",)),
    "mx-nochunking.example": ("10.251.2.5", ("chunking",)),
}
MX_OPTION = {
    "mx-default.example": "MX offers PIPELINING + CHUNKING",
    "mx-nopipelining.example": "MX without PIPELINING",
    "mx-nochunking.example": "MX without CHUNKING",
}
USERS = ("bob", "carol", "dave")
KINDS = ("plain", "multi-recipient", "dot-lines", "8-bit", "200 KB")
KIND_OPTION = {
    "plain": "plain message",
    "multi-recipient": "multi-recipient (3)",
    "dot-lines": "dot-lines and a lone '.'",
    "8-bit": "8-bit body",
    "200 KB": "200 KB message",
}
SINGLE, REUSE = "one connection per message", "connection reuse"
QUEUED_AS = re.compile(r"^250[ -].*\bqueued as (?P<queue_id>[0-9A-Za-z]+)")


@dataclass(frozen=True)
class Probe:
    """One message to send and check."""

    token: str
    kind: str
    domain: str
    mode: str
    sender: str
    recipients: tuple[str, ...]
    content: bytes  # LF line endings, ends with "\n"

    @property
    def message_id(self) -> str:
        return f"{self.token}@{SENDER_DOMAIN}"

    @property
    def body(self) -> bytes:
        return split_message(self.content)[1]

    @property
    def options(self) -> tuple[str, ...]:
        """The matrix rows this probe counts in."""
        return (MX_OPTION[self.domain], self.mode, KIND_OPTION[self.kind])


def _body(kind: str, token: str, *, last_line_dot: bool) -> bytes:
    intro = f"Probe {token} ({kind}) sent through mailsluice.\n".encode()
    if kind == "dot-lines":
        return intro + (
            b".a line that starts with a dot\n"
            b"..two dots\n"
            b"...\n"
            b".\n"
            b"the line above is a lone dot; the next one is a dot and a space\n"
            b". \n"
            b"QUIT\n"
            b"RSET\n" + (b".\n" if last_line_dot else b".\nand a line after the last lone dot\n")
        )
    if kind == "8-bit":
        return (
            intro
            + (
                "Gr\u00fc\u00dfe aus K\u00f6ln, \u00e9t\u00e9 \u00e0 Montr\u00e9al, "
                "\u65e5\u672c\u8a9e\u306e\u672c\u6587, \u0420\u043e\u0441\u0441\u0438\u044f\n"
            ).encode()
            + b"raw Latin-1 bytes: caf\xe9 na\xefve \xa9 \xff\n"
        )
    if kind == "200 KB":
        rng = random.Random(token)
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 ,;:-"
        lines = [intro]
        size = len(intro)
        while size < 200 * 1024:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 76)))
            line = (("." if rng.random() < 0.02 else "") + text + "\n").encode()
            lines.append(line)
            size += len(line)
        return b"".join(lines)
    return intro + b"Nothing special in here.\n"


def make_probe(
    token: str, kind: str, domain: str, mode: str, *, last_line_dot: bool = True
) -> Probe:
    """A probe of ``kind`` to ``domain``; multi-recipient probes have three recipients.

    ``last_line_dot``: the dot-lines body ends with a lone "." (swaks takes a final lone
    dot for the end-of-data mark, as its manual says: give it False).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    users = USERS if kind == "multi-recipient" else USERS[:1]
    sender = f"web@{SENDER_DOMAIN}"
    headers = [
        f"From: Tenant web site <{sender}>",
        f"To: {', '.join(f'{user}@{domain}' for user in users)}",
        f"Subject: interop probe {token} ({kind})",
        f"Message-ID: <{token}@{SENDER_DOMAIN}>",
        "Date: Tue, 01 Dec 2026 12:00:00 +0000",
    ]
    if kind == "8-bit":
        headers += [
            "MIME-Version: 1.0",
            "Content-Type: text/plain; charset=utf-8",
            "Content-Transfer-Encoding: 8bit",
        ]
    content = (
        "\n".join(headers).encode() + b"\n\n" + _body(kind, token, last_line_dot=last_line_dot)
    )
    return Probe(
        token=token,
        kind=kind,
        domain=domain,
        mode=mode,
        sender=sender,
        recipients=tuple(f"{user}@{domain}" for user in users),
        content=content,
    )


def probes(
    prefix: str,
    mode: str,
    *,
    domains: Sequence[str] = tuple(MX_LISTENERS),
    kinds: Sequence[str] = KINDS,
    last_line_dot: bool = True,
) -> list[Probe]:
    """Every kind to every domain, tokens ``PREFIX-<n>``."""
    return [
        make_probe(f"{prefix}-{index}", kind, domain, mode, last_line_dot=last_line_dot)
        for index, (domain, kind) in enumerate(
            (domain, kind) for domain in domains for kind in kinds
        )
    ]


@dataclass(frozen=True)
class Confirmation:
    """What the MTA's own log says about one recipient of one probe."""

    token: str
    recipient: str
    outcome: str  # "sent", "deferred", "bounced"
    reply: str  # the MX's reply (or the reason) as the MTA logged it
    reused: bool = False  # sent on a connection an earlier transaction had opened

    @property
    def queue_id(self) -> str | None:
        match = QUEUED_AS.match(self.reply)
        return match["queue_id"] if match else None


@dataclass
class Verdict:
    """What happened to one probe, end to end."""

    probe: Probe
    copies: dict[str, int]  # recipient -> copies at the MX
    sent: int  # recipients the MTA logged as sent with a "queued as" id the MX stored
    deferrals: int  # deferral entries in the MTA's log (each attempt counts)
    bounces: int
    problems: list[str] = field(default_factory=list)

    @property
    def delivered(self) -> int:
        return sum(1 for count in self.copies.values() if count >= 1)

    @property
    def duplicates(self) -> int:
        return sum(count - 1 for count in self.copies.values() if count > 1)


def judge(
    sent: Sequence[Probe],
    stored: Sequence[StoredMessage],
    confirmations: Sequence[Confirmation],
    *,
    still_queued: Iterable[str] = (),
    frozen: Iterable[str] = (),
) -> list[Verdict]:
    """Each probe against the MX's copies and the MTA's log (tokens queued or frozen)."""
    queued, frozen_tokens = set(still_queued), set(frozen)
    verdicts = []
    for probe in sent:
        copies = [copy for copy in stored if copy.message_id == probe.message_id]
        mine = [c for c in confirmations if c.token == probe.token]
        problems: list[str] = []
        counts = dict.fromkeys(probe.recipients, 0)
        for copy in copies:
            if copy.recipient not in counts:
                problems.append(f"copy for a stranger {copy.recipient}: {copy.path}")
                continue
            counts[copy.recipient] += 1
            if copy.body != probe.body:
                problems.append(
                    f"{copy.recipient}: body differs ({_first_difference(probe.body, copy.body)})"
                )
            if copy.protocol != "ESMTPS":
                problems.append(
                    f"{copy.recipient}: the MX got it over {copy.protocol or '?'}, not TLS"
                )
        sent_ok = 0
        for rcpt in probe.recipients:
            if counts[rcpt] != 1:
                problems.append(f"{rcpt}: {counts[rcpt]} copies at the MX")
            sends = [c for c in mine if c.recipient == rcpt and c.outcome == "sent"]
            stored_ids = {c.queue_id for c in copies if c.recipient == rcpt}
            if len(sends) != 1:
                problems.append(f"{rcpt}: the MTA logged {len(sends)} deliveries")
            for confirmation in sends:
                if confirmation.queue_id is None:
                    problems.append(f"{rcpt}: no queue id in {confirmation.reply!r}")
                elif confirmation.queue_id not in stored_ids:
                    problems.append(
                        f"{rcpt}: confirmed as {confirmation.queue_id}, the MX stored "
                        f"{sorted(stored_ids)}"
                    )
                else:
                    sent_ok += 1
        deferrals = [c for c in mine if c.outcome == "deferred"]
        bounces = [c for c in mine if c.outcome == "bounced"]
        problems += [f"{c.recipient}: deferred: {c.reply}" for c in deferrals]
        problems += [f"{c.recipient}: bounced: {c.reply}" for c in bounces]
        if probe.token in queued:
            problems.append("still on the MTA's queue")
        if probe.token in frozen_tokens:
            problems.append("frozen on the MTA's queue")
        verdicts.append(
            Verdict(
                probe=probe,
                copies=counts,
                sent=sent_ok,
                deferrals=len(deferrals),
                bounces=len(bounces),
                problems=problems,
            )
        )
    return verdicts


def _first_difference(expected: bytes, got: bytes) -> str:
    for index, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            want, have = expected[index : index + 20], got[index : index + 20]
            return f"first at byte {index}: {want!r} vs {have!r}"
    return f"lengths {len(expected)} vs {len(got)}"


@dataclass(frozen=True)
class Row:
    """One cell row of the matrix."""

    mta: str
    option: str
    recipients: int  # recipient deliveries expected
    delivered: int  # of them, stored at the MX at least once
    duplicates: int  # extra copies at the MX
    deferrals: int  # deferral entries in the MTA's log
    problems: int  # probes with any problem


def rows(mta: str, verdicts: Sequence[Verdict]) -> list[Row]:
    """The matrix rows of one MTA: one per option, then "all"."""
    options: dict[str, list[Verdict]] = {}
    for verdict in verdicts:
        for option in verdict.probe.options:
            options.setdefault(option, []).append(verdict)
    options["all"] = list(verdicts)
    return [
        Row(
            mta=mta,
            option=option,
            recipients=sum(len(v.probe.recipients) for v in group),
            delivered=sum(v.delivered for v in group),
            duplicates=sum(v.duplicates for v in group),
            deferrals=sum(v.deferrals for v in group),
            problems=sum(1 for v in group if v.problems),
        )
        for option, group in options.items()
    ]


def report(
    mta: str, verdicts: Sequence[Verdict], extra: Mapping[str, object] | None = None
) -> None:
    """Append the rows to ``$MAILSLUICE_INTEROP_REPORT`` (if set): JSON, one row a line."""
    target = os.environ.get(REPORT_ENV)
    if not target:
        return
    with Path(target).open("a", encoding="utf-8") as out:
        for row in rows(mta, verdicts):
            out.write(json.dumps({**asdict(row), **(extra or {})}) + "\n")


def summary(verdicts: Sequence[Verdict]) -> str:
    """Every problem, one line each (for an assertion message)."""
    lines = [
        f"{v.probe.token} ({v.probe.kind}, {v.probe.domain}, {v.probe.mode}): {problem}"
        for v in verdicts
        for problem in v.problems
    ]
    return "\n".join(lines) if lines else "no problems"


ORDER = (*MX_OPTION.values(), SINGLE, REUSE, *KIND_OPTION.values(), "all")


def _order(option: object) -> int:
    return ORDER.index(str(option)) if option in ORDER else len(ORDER)


def render(records: Sequence[Mapping[str, object]]) -> str:
    """The matrix in Markdown, one line per MTA and option: delivered, duplicates, deferrals."""
    head = "| MTA | option | delivered | duplicates | deferrals |\n|---|---|---|---|---|\n"
    body = [
        f"| {r['mta']} | {r['option']} | {r['delivered']}/{r['recipients']}"
        f" | {r['duplicates']} | {r['deferrals']} |"
        for r in sorted(records, key=lambda r: (str(r["mta"]), _order(r["option"])))
    ]
    return head + "\n".join(body) + "\n"


def render_pivot(records: Sequence[Mapping[str, object]]) -> str:
    """The matrix in Markdown, one line per MTA, one column per option.

    Each cell: recipients delivered / expected · duplicates · deferrals. An option an MTA
    cannot do (connection reuse for one-message clients) is "n/a".
    """
    options = sorted({str(r["option"]) for r in records}, key=_order)
    cells: dict[str, dict[str, str]] = {}
    for r in records:
        cell = f"{r['delivered']}/{r['recipients']} · {r['duplicates']} · {r['deferrals']}"
        cells.setdefault(str(r["mta"]), {})[str(r["option"])] = cell
    head = "| MTA | " + " | ".join(options) + " |\n|---" + "|---" * len(options) + "|\n"
    body = [
        f"| {mta} | " + " | ".join(row.get(option, "n/a") for option in options) + " |"
        for mta, row in sorted(cells.items())
    ]
    return head + "\n".join(body) + "\n"


def main(argv: Sequence[str]) -> int:
    """``python -m tests.support.interop [--long] FILE...``: the matrix of report files."""
    long = "--long" in argv
    files = [arg for arg in argv if arg != "--long"]
    if not files:
        print("usage: python -m tests.support.interop [--long] REPORT.jsonl ...", file=sys.stderr)
        return 2
    records: list[Mapping[str, object]] = []
    for name in files:
        records += [json.loads(line) for line in Path(name).read_text().splitlines() if line]
    print((render if long else render_pivot)(records), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
