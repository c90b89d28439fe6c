"""The filter chain: run the configured filters on one message and settle its fate.

Filters run in order; each sees the message as the previous ones left it (``EditHeaders``
applied by :func:`~mailsluice.filtering.message.apply_header_edits`, ``Replace``
canonicalised); the first ``Reject`` ends the chain. A filter that raises, runs past
``timeout`` seconds, or answers something that is not a valid verdict (a non-verdict, a
``Reject`` whose code is not 4xx/5xx, edits that cannot be applied) is *failed*: it is
logged with its name, counted, and the failure policy applies: ``Reject`` (default
``451 4.3.0``: the client tries again later) or ``Accept`` (skip the filter, fail open).

Replies are sanitised so that a filter can never produce a bad or positive SMTP reply: one
line of printable ASCII (CR, LF, NUL and other controls become spaces), at most
``MAX_REPLY_TEXT`` characters, starting with an enhanced status code of the reply's class
(``4.7.1``/``5.7.1`` added when missing); a 2xx "reject" becomes ``451 4.3.0``.

The :class:`Outcome` says relay (``message`` None: unchanged; otherwise the new canonical
message, to be sent as ``dot_stuff(message) + END_OF_DATA``) or reject (``reply``), which
filter decided, and what each filter did and how long it took.

Cancelling :meth:`FilterChain.run` (the client went away) cancels the running filter: the
cancellation propagates into its ``await`` and out of ``run``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from mailsluice.filtering.api import (
    Accept,
    EditHeaders,
    FilterMessage,
    MessageFilter,
    Reject,
    Replace,
)
from mailsluice.filtering.message import apply_header_edits, canonicalize
from mailsluice.filtering.splice import IN_MEMORY_EDIT, Spliced, edit_spliced, spliced_message

__all__ = [
    "DEFAULT_FAILURE",
    "MAX_REPLY_TEXT",
    "ChainCounters",
    "FilterChain",
    "FilterCounts",
    "FilterRun",
    "Outcome",
    "sanitize_reject",
]

log = logging.getLogger("mailsluice.filtering")

MAX_REPLY_TEXT = 400
DEFAULT_FAILURE = Reject(451, "4.3.0 Message filter unavailable, try again later")
_POSITIVE_REJECT = Reject(451, "4.3.0 Message filter error, try again later")
_FAILED = ("error", "timeout", "invalid")
_ENHANCED = re.compile(r"([245])\.(\d{1,3})\.(\d{1,3})(?: |$)")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterRun:
    """What one filter did: ``result`` is accept, reject, edit, replace (its verdict) or
    error, timeout, invalid (it failed)."""

    name: str
    result: str
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """The chain's decision. ``reply`` None: relay ``message`` (None = the message as
    received). Otherwise refuse with ``reply`` (sanitised: 4xx/5xx, one line, enhanced
    status code first); ``message`` is then None."""

    reply: Reject | None
    message: bytes | None = None
    spliced: Spliced | None = None  # large message, headers edited: new head + the old tail
    decided_by: str = ""  # the filter whose verdict or failure gave ``reply``; "" to relay
    failed: bool = False  # ``reply`` is the failure policy's (a filter failed)
    runs: tuple[FilterRun, ...] = ()

    def __post_init__(self) -> None:
        if self.reply is not None and (self.message is not None or self.spliced is not None):
            raise ValueError("a rejecting Outcome carries no message")
        if self.message is not None and self.spliced is not None:
            raise ValueError("an Outcome carries either a new message or a spliced one")

    @property
    def relay(self) -> bool:
        return self.reply is None

    @property
    def seconds(self) -> float:
        """Time spent in the filters."""
        return sum(run.seconds for run in self.runs)


@dataclass(slots=True)
class FilterCounts:
    """Counters of one filter (mutable; read a copy with :meth:`ChainCounters.snapshot`)."""

    runs: int = 0
    rejects: int = 0  # valid Reject verdicts
    failures: int = 0  # raised, or answered an invalid verdict
    timeouts: int = 0


@dataclass(slots=True)
class ChainCounters:
    """Per-filter counters, owned by one chain (share one between chains to sum them)."""

    by_filter: dict[str, FilterCounts] = field(default_factory=dict)

    def of(self, name: str) -> FilterCounts:
        return self.by_filter.setdefault(name, FilterCounts())

    def snapshot(self) -> dict[str, FilterCounts]:
        return {
            name: FilterCounts(c.runs, c.rejects, c.failures, c.timeouts)
            for name, c in self.by_filter.items()
        }


class _Failed(Exception):
    """A filter's invalid answer; the message says what was wrong."""


class _PositiveReject(_Failed):
    """A Reject with a 2xx code: always 451 4.3.0, whatever the failure policy."""


def _clean_text(text: str) -> str:
    text = _UNPRINTABLE.sub(" ", text).encode("ascii", "replace").decode("ascii")
    return " ".join(text.split())


def sanitize_reject(reject: Reject) -> Reject:
    """The reply to give for ``reject``: one safe line with an enhanced status code.

    ValueError if the code is not an int in 400..599 (the caller applies its policy).
    """
    code = reject.code
    if isinstance(code, bool) or not isinstance(code, int) or not 400 <= code <= 599:
        raise ValueError(f"reply code {code!r} is not 4xx or 5xx")
    if not isinstance(reject.text, str):
        raise ValueError(f"reply text is a {type(reject.text).__name__}, not a str")
    cls = str(code // 100)
    text = _clean_text(reject.text)
    match = _ENHANCED.match(text)
    if match is None:
        text = f"{cls}.7.1 {text or 'Message refused'}"
    elif match.group(1) != cls:  # RFC 3463: the class must agree with the reply code
        text = cls + text[1:]
    if len(text) > MAX_REPLY_TEXT:
        text = text[: MAX_REPLY_TEXT - 3].rstrip() + "..."
    return Reject(code, text)


class FilterChain:
    """Runs ``filters`` on messages; one chain serves any number of messages."""

    __slots__ = ("_failure", "_filters", "_timeout", "counters")

    def __init__(
        self,
        filters: Sequence[MessageFilter],
        *,
        timeout: float,
        failure: Reject | Accept = DEFAULT_FAILURE,
        counters: ChainCounters | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"filter timeout must be more than 0 seconds, not {timeout!r}")
        names = [getattr(f, "name", None) for f in filters]
        for f, name in zip(filters, names, strict=True):
            if not isinstance(name, str) or not name or not isinstance(f, MessageFilter):
                raise ValueError(
                    f"{f!r} is not a message filter: it needs a non-empty str `name` "
                    "and an async `filter(message)` method"
                )
        duplicates = sorted({n for n in names if names.count(n) > 1 and n is not None})
        if duplicates:
            raise ValueError(f"filter names must be unique; give distinct names to {duplicates}")
        if isinstance(failure, Reject):
            try:
                failure = sanitize_reject(failure)
            except ValueError as exc:
                raise ValueError(f"filter failure policy: {exc}; use e.g. 451") from exc
        elif not isinstance(failure, Accept):
            raise ValueError("filter failure policy must be a Reject (4xx/5xx) or Accept")
        self._filters = tuple(filters)
        self._timeout = float(timeout)
        self._failure = failure
        self.counters = counters if counters is not None else ChainCounters()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self._filters)

    async def run(self, message: FilterMessage) -> Outcome:
        """Decide about ``message``. Never raises for a filter's fault (only on
        cancellation)."""
        current = message
        changed: bytes | None = None
        spliced: Spliced | None = None  # large messages: header edits never load the body
        runs: list[FilterRun] = []
        for flt in self._filters:
            counts = self.counters.of(flt.name)
            counts.runs += 1
            started = time.perf_counter()
            result, answer = await self._call(flt, current)
            reply: Reject | None = None
            failure = self._failure_reply
            if result == "verdict" and self._splice_first(answer, message, changed):
                assert isinstance(answer, EditHeaders)
                try:
                    edited = edit_spliced(message, spliced, answer)
                except (ValueError, TypeError) as exc:
                    self._log_failure(flt.name, message, f"answered bad header edits: {exc}")
                    result = "invalid"
                else:
                    if edited is not None:
                        result, spliced = "edit", edited
                        current = spliced_message(message, spliced)
            if result == "verdict":
                try:
                    result, reply, new = self._apply(answer, current)
                except _Failed as exc:
                    self._log_failure(flt.name, message, str(exc))
                    result = "invalid"
                    if isinstance(exc, _PositiveReject):
                        failure = _POSITIVE_REJECT
                else:
                    if new is not None:
                        changed, spliced = new, None
                        current = FilterMessage(
                            client=message.client, envelope=message.envelope, raw=new
                        )
            runs.append(
                FilterRun(name=flt.name, result=result, seconds=time.perf_counter() - started)
            )
            if result in _FAILED:
                if result == "timeout":
                    counts.timeouts += 1
                else:
                    counts.failures += 1
                if failure is None:
                    continue  # the failure policy is Accept: skip this filter
                return Outcome(reply=failure, decided_by=flt.name, failed=True, runs=tuple(runs))
            if reply is not None:
                counts.rejects += 1
                return Outcome(reply=reply, decided_by=flt.name, runs=tuple(runs))
        return Outcome(reply=None, message=changed, spliced=spliced, runs=tuple(runs))

    @staticmethod
    def _splice_first(answer: object, message: FilterMessage, changed: bytes | None) -> bool:
        """Header edits on a large message that still has its original body: splice."""
        if not isinstance(answer, EditHeaders) or changed is not None:
            return False
        return message.size > IN_MEMORY_EDIT and bool(answer.add or answer.change)

    @property
    def _failure_reply(self) -> Reject | None:
        return self._failure if isinstance(self._failure, Reject) else None

    async def _call(self, flt: MessageFilter, message: FilterMessage) -> tuple[str, object]:
        """("verdict", answer) or (failure kind, None); CancelledError of run() propagates."""
        task = asyncio.current_task()
        try:
            async with asyncio.timeout(self._timeout) as deadline:
                answer: object = await flt.filter(message)
        except TimeoutError:
            if deadline.expired():
                log.warning(
                    "filter %s timed out after %gs (session %s, transaction %d)",
                    flt.name, self._timeout, message.client.session_id,
                    message.envelope.transaction,
                )  # fmt: skip
                return "timeout", None
            self._log_failure(flt.name, message, "raised TimeoutError", exc_info=True)
            return "error", None
        except asyncio.CancelledError:
            if task is None or task.cancelling():
                raise  # run() itself is cancelled
            self._log_failure(flt.name, message, "raised CancelledError", exc_info=True)
            return "error", None
        except Exception as exc:
            self._log_failure(flt.name, message, f"raised {exc!r}", exc_info=True)
            return "error", None
        if task is not None and task.cancelling():
            raise asyncio.CancelledError  # the filter swallowed our cancellation
        if deadline.expired():  # it swallowed the timeout and answered late
            log.warning("filter %s ignored its %gs timeout", flt.name, self._timeout)
            return "timeout", None
        if answer is None:
            self._log_failure(flt.name, message, "answered None, not a verdict")
            return "invalid", None
        return "verdict", answer

    @staticmethod
    def _apply(verdict: object, current: FilterMessage) -> tuple[str, Reject | None, bytes | None]:
        """(result, sanitised reply, new message) for a filter's answer; _Failed if invalid."""
        if isinstance(verdict, Accept):
            return "accept", None, None
        if isinstance(verdict, Reject):
            code = verdict.code
            if isinstance(code, int) and not isinstance(code, bool) and 200 <= code <= 299:
                raise _PositiveReject(f"answered a 2xx Reject ({code}): replaced by 451 4.3.0")
            try:
                return "reject", sanitize_reject(verdict), None
            except ValueError as exc:
                raise _Failed(f"answered an invalid Reject: {exc}") from exc
        if isinstance(verdict, EditHeaders):
            if not verdict.add and not verdict.change:
                return "accept", None, None
            try:
                raw = current.raw()
            except (OSError, ValueError) as exc:  # a spool problem: ours, still a 4xx
                raise _Failed(f"edits not applied, the message cannot be read: {exc}") from exc
            try:
                edited = apply_header_edits(raw, verdict)
            except Exception as exc:
                raise _Failed(f"answered header edits that cannot be applied: {exc}") from exc
            return "edit", None, edited
        if isinstance(verdict, Replace):
            if not isinstance(verdict.message, bytes):
                raise _Failed(f"answered Replace with a {type(verdict.message).__name__}")
            return "replace", None, canonicalize(verdict.message)
        raise _Failed(f"answered {type(verdict).__name__}, not a verdict")

    @staticmethod
    def _log_failure(
        name: str, message: FilterMessage, what: str, *, exc_info: bool = False
    ) -> None:
        log.warning(
            "filter %s failed: %s (session %s, transaction %d)",
            name, what, message.client.session_id, message.envelope.transaction,
            exc_info=exc_info,
        )  # fmt: skip
