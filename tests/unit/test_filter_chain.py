"""The filter chain: every verdict path, failure isolation, reply sanitising, cancellation."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import pytest

from mailsluice.filtering.api import (
    Accept,
    AddHeader,
    ChangeHeader,
    ClientInfo,
    EditHeaders,
    Envelope,
    FilterMessage,
    Reject,
    Replace,
    Verdict,
)
from mailsluice.filtering.chain import (
    DEFAULT_FAILURE,
    MAX_REPLY_TEXT,
    FilterChain,
    FilterCounts,
    Outcome,
    sanitize_reject,
)
from mailsluice.filtering.message import header_fields, split_header

pytestmark = pytest.mark.unit

CLIENT = ClientInfo(
    session_id="S42", client_ip="127.0.0.1", client_port=2525, destination="127.0.0.2:25", helo="h"
)
ENVELOPE = Envelope(mail_from="a@example.com", rcpt_to=("b@example.com",), transaction=3)
RAW = b"Subject: hello\r\nTo: b@example.com\r\n\r\nbody line\r\n.dot line\r\n"
TIMEOUT = 5.0  # generous: only the hanging filters below ever reach a timeout
SHORT = 0.02  # for chains whose filter hangs on purpose


def message(raw: bytes = RAW) -> FilterMessage:
    return FilterMessage(client=CLIENT, envelope=ENVELOPE, raw=raw)


@dataclass
class Fixed:
    """Answers ``answer`` and remembers the messages it saw."""

    name: str
    answer: object
    seen: list[bytes] = field(default_factory=list)
    read: bool = True  # read the message (False: answer blindly)

    async def filter(self, message: FilterMessage) -> Verdict:
        if self.read:
            self.seen.append(message.raw())
        return self.answer  # type: ignore[return-value]  # deliberately anything


@dataclass
class Raises:
    name: str
    error: BaseException

    async def filter(self, message: FilterMessage) -> Verdict:
        raise self.error


@dataclass
class Hangs:
    """Waits forever; ``swallow``: ignores its cancellation and answers Accept anyway."""

    name: str
    swallow: bool = False
    started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False

    async def filter(self, message: FilterMessage) -> Verdict:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            if not self.swallow:
                raise
        return Accept()


def counts(chain: FilterChain, name: str) -> tuple[int, int, int, int]:
    c = chain.counters.snapshot().get(name, FilterCounts())
    return c.runs, c.rejects, c.failures, c.timeouts


def results(outcome: Outcome) -> list[tuple[str, str]]:
    return [(run.name, run.result) for run in outcome.runs]


# ----------------------------------------------------------------- verdicts
async def test_no_filters_relay_unchanged() -> None:
    outcome = await FilterChain([], timeout=TIMEOUT).run(message())
    assert outcome == Outcome(reply=None)
    assert outcome.relay


async def test_accept_relays_unchanged() -> None:
    a, b = Fixed("a", Accept()), Fixed("b", EditHeaders())
    chain = FilterChain([a, b], timeout=TIMEOUT)
    outcome = await chain.run(message())
    assert (outcome.relay, outcome.message, outcome.decided_by) == (True, None, "")
    assert results(outcome) == [("a", "accept"), ("b", "accept")]
    assert all(run.seconds >= 0 for run in outcome.runs)
    assert a.seen == b.seen == [RAW]
    assert counts(chain, "a") == (1, 0, 0, 0)


async def test_reject_stops_the_chain() -> None:
    later = Fixed("later", Accept())
    chain = FilterChain(
        [Fixed("first", Accept()), Fixed("judge", Reject(554, "5.7.1 spam")), later],
        timeout=TIMEOUT,
    )
    outcome = await chain.run(message())
    assert outcome.reply == Reject(554, "5.7.1 spam")
    assert (outcome.relay, outcome.message, outcome.decided_by, outcome.failed) == (
        False,
        None,
        "judge",
        False,
    )
    assert results(outcome) == [("first", "accept"), ("judge", "reject")]
    assert later.seen == []
    assert counts(chain, "judge") == (1, 1, 0, 0)
    assert counts(chain, "later") == (0, 0, 0, 0)


async def test_edits_are_applied_and_seen_by_the_next_filter() -> None:
    edit = EditHeaders(
        add=(AddHeader("X-Seen", "yes", 0),), change=(ChangeHeader("Subject", "changed"),)
    )
    second = Fixed("second", EditHeaders(change=(ChangeHeader("To", None),)))
    third = Fixed("third", Accept())
    outcome = await FilterChain([Fixed("first", edit), second, third], timeout=TIMEOUT).run(
        message()
    )
    expected = (
        b"X-Seen: yes\r\nSubject: changed\r\nTo: b@example.com\r\n\r\n"
        + RAW.split(b"\r\n\r\n", 1)[1]
    )
    assert second.seen == [expected]
    assert third.seen == [expected.replace(b"To: b@example.com\r\n", b"")]
    assert outcome.relay
    assert outcome.message == third.seen[0]
    assert split_header(outcome.message)[1] == split_header(RAW)[1]
    assert results(outcome) == [("first", "edit"), ("second", "edit"), ("third", "accept")]


async def test_replace_is_canonicalised_and_seen_by_the_next_filter() -> None:
    after = Fixed("after", Accept())
    replace = Fixed("replace", Replace(b"Subject: new\n\n.\nend"))
    outcome = await FilterChain([replace, after], timeout=TIMEOUT).run(message())
    assert after.seen == [b"Subject: new\r\n\r\n.\r\nend\r\n"]
    assert outcome.message == after.seen[0]
    assert results(outcome) == [("replace", "replace"), ("after", "accept")]


async def test_edit_after_replace_edits_the_replacement() -> None:
    chain = FilterChain(
        [
            Fixed("replace", Replace(b"A: 1\r\n\r\nnew body\r\n")),
            Fixed("edit", EditHeaders(add=(AddHeader("B", "2"),))),
        ],
        timeout=TIMEOUT,
    )
    outcome = await chain.run(message())
    assert outcome.message == b"A: 1\r\nB: 2\r\n\r\nnew body\r\n"


# ----------------------------------------------------------------- failures
FAILURE = Reject(554, "5.3.0 filters broken")


@pytest.mark.parametrize(
    ("bad", "result"),
    [
        (Raises("bad", RuntimeError("kaput")), "error"),
        (Raises("bad", TimeoutError("its own timeout")), "error"),  # not ours: an error
        (Raises("bad", asyncio.CancelledError()), "error"),  # leaked, we were not cancelled
        (Fixed("bad", None), "invalid"),
        (Fixed("bad", "OK"), "invalid"),
        (Fixed("bad", 250), "invalid"),
        (Fixed("bad", Reject(600, "6.0.0 nonsense")), "invalid"),
        (Fixed("bad", Reject(399, "x")), "invalid"),
        (Fixed("bad", Reject(True, "x")), "invalid"),  # bool is an int to mypy
        (Fixed("bad", Reject(450, b"bytes")), "invalid"),  # type: ignore[arg-type]
        (Fixed("bad", EditHeaders(add=(AddHeader("Bad Name", "v"),))), "invalid"),
        (Fixed("bad", EditHeaders(add=(AddHeader("X", "a\r\n.\r\nRSET"),))), "invalid"),
        (Fixed("bad", EditHeaders(change=("Subject",))), "invalid"),  # type: ignore[arg-type]
        (Fixed("bad", Replace("text, not bytes")), "invalid"),  # type: ignore[arg-type]
        (Hangs("bad"), "timeout"),
        (Hangs("bad", swallow=True), "timeout"),  # ignored its timeout: still a timeout
    ],
)
async def test_a_failing_filter_gets_the_failure_policy(
    bad: Fixed | Raises | Hangs, result: str, caplog: pytest.LogCaptureFixture
) -> None:
    later = Fixed("later", Accept())
    chain = FilterChain([Fixed("good", Accept()), bad, later], timeout=SHORT, failure=FAILURE)
    with caplog.at_level(logging.WARNING, logger="mailsluice.filtering"):
        outcome = await chain.run(message())
    assert outcome.reply == FAILURE
    assert (outcome.decided_by, outcome.failed, outcome.message) == ("bad", True, None)
    assert results(outcome) == [("good", "accept"), ("bad", result)]
    assert later.seen == []
    timeouts = int(result == "timeout")
    assert counts(chain, "bad") == (1, 0, 1 - timeouts, timeouts)
    assert any("filter bad" in r.getMessage() for r in caplog.records), caplog.text
    if isinstance(bad, Hangs):
        assert bad.cancelled


async def test_default_failure_policy_is_451() -> None:
    outcome = await FilterChain([Raises("x", ValueError())], timeout=TIMEOUT).run(message())
    assert outcome.reply == DEFAULT_FAILURE
    assert outcome.reply.code == 451
    assert outcome.reply.text.startswith("4.3.0 ")


@pytest.mark.parametrize("code", [200, 250, 299])
async def test_a_2xx_reject_becomes_451_whatever_the_policy(code: int) -> None:
    chain = FilterChain([Fixed("liar", Reject(code, "2.0.0 Ok"))], timeout=TIMEOUT, failure=FAILURE)
    outcome = await chain.run(message())
    assert outcome.reply is not None
    assert outcome.reply.code == 451
    assert outcome.reply.text.startswith("4.3.0 ")
    assert (outcome.decided_by, outcome.failed) == ("liar", True)
    assert counts(chain, "liar") == (1, 0, 1, 0)


async def test_accept_policy_skips_a_failing_filter() -> None:
    later = Fixed("later", EditHeaders(add=(AddHeader("X", "1"),)))
    chain = FilterChain(
        [Raises("broken", OSError("down")), Hangs("slow"), Fixed("odd", "?"), later],
        timeout=SHORT,
        failure=Accept(),
    )
    outcome = await chain.run(message())
    assert outcome.relay
    assert outcome.message is not None
    assert header_fields(outcome.message)[-1] == b"X: 1\r\n"
    assert later.seen == [RAW]
    assert results(outcome) == [
        ("broken", "error"),
        ("slow", "timeout"),
        ("odd", "invalid"),
        ("later", "edit"),
    ]
    assert counts(chain, "slow") == (1, 0, 0, 1)
    assert counts(chain, "odd") == (1, 0, 1, 0)


async def test_a_2xx_reject_is_451_even_with_the_accept_policy() -> None:
    """The filter meant to refuse (it answered Reject): a tempfail, never a silent relay."""
    chain = FilterChain([Fixed("liar", Reject(250, "ok"))], timeout=TIMEOUT, failure=Accept())
    outcome = await chain.run(message())
    assert outcome.reply is not None
    assert (outcome.reply.code, outcome.failed) == (451, True)


async def test_counters_add_up_over_runs() -> None:
    flaky = Fixed("flaky", Reject(550, "no"))
    chain = FilterChain([flaky], timeout=TIMEOUT)
    await chain.run(message())
    flaky.answer = None
    await chain.run(message())
    flaky.answer = Accept()
    await chain.run(message())
    assert counts(chain, "flaky") == (3, 1, 1, 0)


# ----------------------------------------------------------------- cancellation
async def test_cancelling_run_cancels_the_running_filter() -> None:
    slow, later = Hangs("slow"), Fixed("later", Accept())
    chain = FilterChain([slow, later], timeout=TIMEOUT)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(chain.run(message()))
        await slow.started.wait()
        task.cancel()
    assert task.cancelled()
    assert slow.cancelled
    assert later.seen == []
    assert counts(chain, "slow") == (1, 0, 0, 0)  # the client left: no fault of the filter


async def test_cancellation_wins_over_a_filter_that_swallows_it() -> None:
    slow, later = Hangs("slow", swallow=True), Fixed("later", Accept())
    chain = FilterChain([slow, later], timeout=TIMEOUT)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(chain.run(message()))
        await slow.started.wait()
        task.cancel()
    assert task.cancelled()
    assert slow.cancelled
    assert later.seen == []


async def test_callers_deadline_is_not_a_filter_timeout() -> None:
    slow = Hangs("slow")
    chain = FilterChain([slow], timeout=TIMEOUT)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(SHORT):
            await chain.run(message())
    assert slow.cancelled
    assert counts(chain, "slow") == (1, 0, 0, 0)


# ----------------------------------------------------------------- reply sanitising
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (Reject(550, "5.7.1 spam"), Reject(550, "5.7.1 spam")),
        (Reject(550, "spam"), Reject(550, "5.7.1 spam")),
        (Reject(451, "greylisted"), Reject(451, "4.7.1 greylisted")),
        (Reject(450, ""), Reject(450, "4.7.1 Message refused")),
        (Reject(450, "5.7.1 wrong class"), Reject(450, "4.7.1 wrong class")),
        (Reject(550, "5.7.1"), Reject(550, "5.7.1")),
        (Reject(550, "5.7.1x y"), Reject(550, "5.7.1 5.7.1x y")),
        (Reject(554, "bad\r\n250 2.0.0 Ok\r\n"), Reject(554, "5.7.1 bad 250 2.0.0 Ok")),
        (Reject(554, "nul\x00here\ttab"), Reject(554, "5.7.1 nul here tab")),
        (Reject(554, "caf\u00e9"), Reject(554, "5.7.1 caf?")),
    ],
)
def test_sanitize_reject(given: Reject, expected: Reject) -> None:
    assert sanitize_reject(given) == expected


def test_sanitize_reject_caps_the_length() -> None:
    text = sanitize_reject(Reject(550, "5.7.1 " + "x" * 1000)).text
    assert len(text) == MAX_REPLY_TEXT
    assert text.endswith("...")


async def test_chain_sanitises_a_filter_reply() -> None:
    chain = FilterChain([Fixed("f", Reject(421, "closing\r\n.\r\nQUIT"))], timeout=TIMEOUT)
    outcome = await chain.run(message())
    assert outcome.reply == Reject(421, "4.7.1 closing . QUIT")


# ----------------------------------------------------------------- configuration errors
def test_chain_configuration_errors() -> None:
    with pytest.raises(ValueError, match="timeout"):
        FilterChain([], timeout=0)
    with pytest.raises(ValueError, match="distinct names"):
        FilterChain([Fixed("a", Accept()), Fixed("a", Accept())], timeout=1)
    with pytest.raises(ValueError, match="not a message filter"):
        FilterChain([object()], timeout=1)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="not a message filter"):
        FilterChain([Fixed("", Accept())], timeout=1)
    with pytest.raises(ValueError, match="failure policy"):
        FilterChain([], timeout=1, failure=Reject(250, "ok"))
    assert FilterChain([Fixed("a", Accept())], timeout=1).names == ("a",)


async def test_failure_policy_reply_is_sanitised_too() -> None:
    chain = FilterChain([Raises("x", KeyError())], timeout=1, failure=Reject(452, "later\r\n"))
    outcome = await chain.run(message())
    assert outcome.reply == Reject(452, "4.7.1 later")
