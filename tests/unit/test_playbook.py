"""The playbook harness itself: a script fails on any difference, and says where."""

from __future__ import annotations

import pytest
from tests.unit.playbook import START, Playbook, c, s, to_c, to_s, wait
from tests.unit.relay_wire import CONNECTED, GREETING, dialled, new_relay

from mailsluice.relay import actions as act
from mailsluice.relay import events as ev

pytestmark = pytest.mark.unit


def test_a_faithful_script_passes() -> None:
    assert dialled() >> s(GREETING) << to_c(GREETING)


def test_an_unexpected_action_fails() -> None:
    with pytest.raises(AssertionError, match=r"unexpected action SendToClient"):
        assert dialled() >> s(GREETING)


def test_an_unexpected_action_before_the_next_event_fails() -> None:
    with pytest.raises(AssertionError, match=r"unexpected action ConnectServer"):
        assert Playbook(new_relay()) >> START >> CONNECTED


def test_a_different_action_fails_and_shows_the_play() -> None:
    with pytest.raises(AssertionError) as failed:
        assert dialled() >> s(GREETING) << to_c(b"220 someone else\r\n")
    assert [line.strip() for line in str(failed.value).splitlines()[-2:]] == [
        "!! expected SendToClient(data=b'220 someone else\\r\\n')",
        f"got      SendToClient(data={GREETING!r})",
    ]
    assert ">> ServerData(" in str(failed.value)


def test_an_action_that_never_comes_fails() -> None:
    with pytest.raises(AssertionError, match=r"did nothing more"):
        assert dialled() << to_s(b"EHLO x\r\n")


def test_a_failed_play_stays_failed() -> None:
    book = dialled() >> s(GREETING)
    with pytest.raises(AssertionError):
        assert book
    with pytest.raises(AssertionError, match="unexpected action"):
        assert book << to_c(GREETING)


def test_a_play_goes_on_from_where_it_stopped() -> None:
    """Each event is fed once, however often the playbook is asserted."""
    book = dialled() >> s(GREETING) << to_c(GREETING)
    assert book
    assert book
    fed = len(book.seen)
    assert book >> c(b"NOOP\r\n") << to_s(b"NOOP\r\n")
    assert len(book.seen) > fed
    assert book.seen.count(to_c(GREETING)) == 1


def test_ignore_applies_to_the_events_fed_after_it_changed() -> None:
    book = dialled()
    assert book
    book.ignore = (act.Log,)
    with pytest.raises(AssertionError, match=r"unexpected action SetTimer"):
        assert book >> s(GREETING) << to_c(GREETING)


def test_wait_moves_the_clock_and_feeds_nothing() -> None:
    book = dialled() >> wait(30) >> ev.TimerExpired()
    with pytest.raises(AssertionError):
        assert book
    assert book.now == pytest.approx(1_000.0 + 30 + 2 * book.step)
