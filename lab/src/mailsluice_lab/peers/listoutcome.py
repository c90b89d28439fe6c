"""What a mailing-list delivery came to, recipient by recipient (the pure half of
:mod:`.listclient`).

* VERP addresses as Postfix builds them (:func:`verp_address`: ``list-bounces`` and
  ``user@example.org`` with the delimiters ``+=`` give
  ``list-bounces+user=example.org@lists.example``) and the ``XVERP`` parameter that asks
  a server to do it (:func:`xverp_parameter`).
* How a reply to RCPT counts for its recipient (:func:`rcpt_verdict`): accepted, "too many
  recipients" (``452 4.5.3``: send it again in a new transaction, RFC 5321 §4.5.3.1.10),
  deferred (any other 4xx) or rejected (5xx).
* The per-recipient record (:class:`RecipientResult`, :class:`ListOutcome`): delivered (2xx
  to end-of-data), deferred (4xx anywhere, or the connection lost before the final dot),
  rejected (5xx), ambiguous (the connection lost, or no reply in time, after the final dot:
  the MX may hold the copy; a retry may duplicate it, never lose it).
* The no-loss oracle for lists (:func:`list_problems`): what an MX stored, copy by copy,
  against what the list client was told (the ledger's own check keys on a token per
  message, but a list sends one content to many recipients).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from mailsluice_lab.peers.ledger import StoredMessage, normalise_reply

#: Postfix's default VERP delimiters (``default_verp_delimiters``).
DEFAULT_DELIMITERS = "+="
#: The characters Postfix allows as VERP delimiters (``verp_delimiter_filter``).
DELIMITER_CHARACTERS = "-=+"


class Status(StrEnum):
    DELIVERED = "delivered"
    DEFERRED = "deferred"
    REJECTED = "rejected"
    AMBIGUOUS = "ambiguous"


class RcptVerdict(StrEnum):
    ACCEPTED = "accepted"
    TOO_MANY = "too-many"  # 452 4.5.3: try again in a new transaction, now
    DEFERRED = "deferred"
    REJECTED = "rejected"


def verp_address(sender: str, recipient: str, delimiters: str = DEFAULT_DELIMITERS) -> str:
    """The VERP return path of ``recipient``'s copy, as Postfix builds it.

    ``verp_address("list-bounces@lists.example", "user@example.org")`` is
    ``list-bounces+user=example.org@lists.example``; a recipient without a domain keeps
    its local part only (``list-bounces+user@lists.example``).
    """
    if len(delimiters) != 2:
        raise ValueError(f"VERP delimiters are two characters, got {delimiters!r}")
    local, at, domain = sender.rpartition("@")
    if not at:
        local, domain = sender, ""
    if not local:
        raise ValueError("VERP needs a non-null sender")
    r_local, r_at, r_domain = recipient.rpartition("@")
    encoded = f"{r_local}{delimiters[1]}{r_domain}" if r_at else recipient
    tail = f"@{domain}" if domain else ""
    return f"{local}{delimiters[0]}{encoded}{tail}"


def xverp_parameter(delimiters: str) -> str:
    """``XVERP`` (Postfix's defaults, for ``""``) or ``XVERP=xy``."""
    return "XVERP" if not delimiters else f"XVERP={delimiters}"


def enhanced_code(text: str) -> str | None:
    """The RFC 3463 code at the start of a reply line's text (``"4.5.3"``), or None."""
    head = text.split(" ", 1)[0]
    parts = head.split(".")
    if len(parts) == 3 and all(p.isdigit() for p in parts) and parts[0] in "245":
        return head
    return None


def too_many_recipients(code: int, first_line: str) -> bool:
    """``452 4.5.3`` (or a bare 452 that says so): the rest go in a new transaction."""
    if code != 452:
        return False
    enhanced = enhanced_code(first_line)
    if enhanced is not None:
        return enhanced == "4.5.3"
    return "too many recipients" in first_line.lower()


def rcpt_verdict(code: int, first_line: str) -> RcptVerdict:
    """What a reply to RCPT means for its recipient."""
    if 200 <= code < 300:
        return RcptVerdict.ACCEPTED
    if too_many_recipients(code, first_line):
        return RcptVerdict.TOO_MANY
    return RcptVerdict.DEFERRED if code < 500 else RcptVerdict.REJECTED


def status_of_code(code: int) -> Status:
    """A final reply's meaning: 2xx delivered, 5xx rejected, anything else deferred."""
    if 200 <= code < 300:
        return Status.DELIVERED
    return Status.REJECTED if code >= 500 else Status.DEFERRED


@dataclass(frozen=True, slots=True)
class RecipientResult:
    """One recipient's answer in one attempt: the reply that decided it (``code`` None:
    no reply, ``reply`` then says what happened on the wire), and in which transaction."""

    recipient: str
    status: Status
    code: int | None
    reply: str
    transaction: int = 0


@dataclass(frozen=True)
class ListOutcome:
    """Every recipient's last answer (``results``, in the order given), every answer on the
    way (``history``, retries included), and what it took."""

    results: tuple[RecipientResult, ...]
    history: tuple[RecipientResult, ...]
    transactions: int  # MAIL commands sent
    connections: int
    capabilities: tuple[str, ...] = ()  # the EHLO keywords of the first connection

    def status(self, recipient: str) -> Status:
        for result in self.results:
            if result.recipient == recipient:
                return result.status
        raise KeyError(recipient)

    def recipients(self, status: Status) -> list[str]:
        return [r.recipient for r in self.results if r.status is status]

    @property
    def counts(self) -> dict[str, int]:
        counted = Counter(r.status.value for r in self.results)
        return {status.value: counted[status.value] for status in Status}

    @property
    def unfinished(self) -> list[str]:
        """Recipients worth another attempt: deferred or ambiguous."""
        return [
            r.recipient for r in self.results if r.status in (Status.DEFERRED, Status.AMBIGUOUS)
        ]

    @property
    def ever_ambiguous(self) -> frozenset[str]:
        """Recipients that were ambiguous in some attempt (a duplicate copy is allowed)."""
        return frozenset(r.recipient for r in self.history if r.status is Status.AMBIGUOUS)

    def then(self, later: ListOutcome) -> ListOutcome:
        """This outcome followed by a later attempt for some of the recipients."""
        last = {r.recipient: r for r in later.results}
        return ListOutcome(
            results=tuple(last.get(r.recipient, r) for r in self.results),
            history=self.history + later.history,
            transactions=self.transactions + later.transactions,
            connections=self.connections + later.connections,
            capabilities=self.capabilities or later.capabilities,
        )


def list_problems(
    outcome: ListOutcome,
    stored: Iterable[StoredMessage],
    *,
    sender: str,
    delimiters: str | None = DEFAULT_DELIMITERS,
    marker: bytes = b"",
    may_duplicate: Collection[str] = (),
) -> list[str]:
    """Every way the MX's copies contradict what the list client was told (empty: good).

    ``stored`` are the MX's messages (those whose content contains ``marker``, when given);
    each must have one recipient and, with ``delimiters``, its VERP return path (``None``:
    the plain ``sender``). Per recipient: LOSS (delivered, no copy), DUPLICATE (more than
    one copy; for a recipient ever ambiguous or in ``may_duplicate``, more than two: a
    relay told the client ``451`` after the MX had stored it, the documented case),
    REFUSED-BUT-STORED (a copy, but the last answer was deferred or rejected and never
    ambiguous), WRONG-REPLY (the client's 2xx is no reply the MX gave for a copy of that
    recipient), WRONG-RETURN-PATH, SHARED-COPY (one stored message for several
    recipients), UNKNOWN (a copy for someone not on the list).
    """
    copies: Counter[str] = Counter()
    replies: dict[str, set[str]] = {}
    problems: list[str] = []
    wanted = {r.recipient for r in outcome.results}
    for message in stored:
        if marker and marker not in message.data:
            continue
        if len(message.rcpt_tos) != 1:
            problems.append(f"SHARED-COPY: #{message.seq} went to {list(message.rcpt_tos)}")
        for rcpt in message.rcpt_tos:
            copies[rcpt] += 1
            replies.setdefault(rcpt, set()).add(normalise_reply(message.reply))
            if rcpt not in wanted:
                problems.append(f"UNKNOWN: #{message.seq} for <{rcpt}>, not on the list")
                continue
            expected = sender if delimiters is None else verp_address(sender, rcpt, delimiters)
            if message.mail_from != expected:
                problems.append(
                    f"WRONG-RETURN-PATH: #{message.seq} for <{rcpt}> from "
                    f"<{message.mail_from}>, expected <{expected}>"
                )
    ambiguous = outcome.ever_ambiguous | frozenset(may_duplicate)
    for result in outcome.results:
        rcpt, count = result.recipient, copies[result.recipient]
        if result.status is Status.DELIVERED and count == 0:
            problems.append(f"LOSS: <{rcpt}> got {result.reply!r}, the MX holds no copy")
        told = normalise_reply(result.reply)
        if result.status is Status.DELIVERED and count and told not in replies[rcpt]:
            problems.append(
                f"WRONG-REPLY: <{rcpt}> was told {told!r}, the MX said {sorted(replies[rcpt])!r}"
            )
        limit = 2 if rcpt in ambiguous else 1
        if count > limit:
            problems.append(f"DUPLICATE: <{rcpt}> has {count} copies at the MX")
        if result.status in (Status.DEFERRED, Status.REJECTED) and count and rcpt not in ambiguous:
            problems.append(
                f"REFUSED-BUT-STORED: <{rcpt}> was last told {result.reply!r}, "
                f"the MX holds {count} copy(ies)"
            )
    return problems


def assert_list_delivered(
    outcome: ListOutcome,
    stored: Sequence[StoredMessage],
    *,
    sender: str,
    delimiters: str | None = DEFAULT_DELIMITERS,
    marker: bytes = b"",
) -> None:
    """Fail unless every recipient was delivered and the MX's copies agree
    (:func:`list_problems`)."""
    problems = list_problems(outcome, stored, sender=sender, delimiters=delimiters, marker=marker)
    unfinished = [r for r in outcome.results if r.status is not Status.DELIVERED]
    problems += [f"NOT-DELIVERED: <{r.recipient}> {r.status}: {r.reply}" for r in unfinished]
    if problems:
        raise AssertionError("list delivery check failed:\n  " + "\n  ".join(problems))
