"""The relay's table of legal moves (``relay.state.MOVES``), keyed by what causes them."""

from __future__ import annotations

import enum

import pytest

from mailsluice.relay.state import (
    MOVES,
    ClientTls,
    IllegalMove,
    Input,
    Link,
    Message,
    On,
    RelayState,
    Stage,
)

pytestmark = pytest.mark.unit

PARTS: tuple[type[enum.Enum], ...] = (Stage, Input, Link, Message, ClientTls)


def test_every_cause_moves_something_and_only_the_parts() -> None:
    assert set(MOVES) == set(On)
    for cause, moves in MOVES.items():
        assert moves, cause
        for old, new in moves:
            assert type(old) is type(new), (cause, old, new)
            assert type(old) in PARTS
            assert old is not new, (cause, old)


def test_every_state_but_the_first_is_reached_by_some_cause() -> None:
    reached = {new for moves in MOVES.values() for _, new in moves}
    first = {Stage.OPENING, Input.OPEN, Link.NONE, Message.NONE, ClientTls.NONE, ClientTls.PLAIN}
    for part in PARTS:
        for value in part:
            assert value in reached or value in first, value


def test_a_cause_makes_all_its_moves_at_once() -> None:
    state = RelayState()
    state.on(On.GREETED)
    state.on(On.GO_AHEAD)
    assert (state.stage, state.message) == (Stage.BODY, Message.BODY)
    state.on(On.MESSAGE_ENDED)
    assert (state.stage, state.message) == (Stage.COMMANDS, Message.NONE)


def test_a_cause_out_of_place_is_a_bug_of_ours() -> None:
    state = RelayState()
    with pytest.raises(IllegalMove, match="go-ahead: Stage opening has no such move"):
        state.on(On.GO_AHEAD)
    state.on(On.GONE)
    with pytest.raises(IllegalMove):
        state.on(On.GONE)  # nothing comes back from gone
    with pytest.raises(IllegalMove):
        state.on(On.CLIENT_STARTTLS)  # not offered to this client (client_tls off)
