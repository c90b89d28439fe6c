"""The dataclasses made for every relayed line have their ``__init__`` written out (issue
25: mypyc compiles it, while the one ``dataclass`` generates runs as Python, about three
times the instructions). Written out, it must stay the generated one: the same
parameters in the same order with the same defaults, every field set, frozen still
frozen."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from mailsluice.native import build
from mailsluice.relay import actions as act
from mailsluice.relay import state
from mailsluice.relay.records import Direction, TranscriptChunk
from mailsluice.smtp.commands import Command
from mailsluice.smtp.lines import Line
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.unit

HOT = [Line, act.SendToClient, act.SendToServer, act.Log, Reply, Command, state.Slot, state.Sent]


_reply = Reply(250, (b"ok",))
_command = Command("RCPT", b"RCPT TO:<a@b>", b"TO:<a@b>")
_slot = state.Slot(state.Owed.RCPT)
# a value of its type for each field, no two alike (the compiled build checks the types)
VALUES: dict[type, dict[str, object]] = {
    Line: {"content": b"x", "bare_lf": True},
    act.SendToClient: {"data": b"to the client"},
    act.SendToServer: {"data": b"to the MX"},
    act.Log: {"record": TranscriptChunk("s1", ((1, 2.0, "c>s", "NOOP"),))},
    Reply: {"code": 451, "lines": (b"a", b"b")},
    Command: {
        "verb": "MAIL", "line": b"MAIL FROM:<a@b> SIZE=9", "argument": b"FROM:<a@b> SIZE=9",
        "address": b"a@b", "params": (("SIZE", b"9"),), "violations": ("bare-space",),
    },
    state.Slot: {
        "kind": state.Owed.MAIL, "barrier": True, "command": _command, "reply": _reply,
        "direction": Direction.CLIENT_TO_SERVER, "close": "quit",
    },
    state.Sent: {
        "what": state.Await.HELLO, "slot": _slot, "command": _command, "fallback": _reply,
        "timeout": 7.5,
    },
}  # fmt: skip


@pytest.mark.skipif(build() == "compiled", reason="a compiled __init__ shows no signature")
@pytest.mark.parametrize("cls", HOT, ids=lambda c: c.__name__)
def test_init_takes_the_fields_in_order_with_their_defaults(cls: type) -> None:
    fields = dataclasses.fields(cls)
    params = list(inspect.signature(vars(cls)["__init__"]).parameters.values())[1:]  # (self)
    assert [p.name for p in params] == [f.name for f in fields]
    for param, field in zip(params, fields, strict=True):
        assert param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        missing = field.default is dataclasses.MISSING
        expected = inspect.Parameter.empty if missing else field.default
        assert param.default == expected, field.name
        assert field.default_factory is dataclasses.MISSING  # (none: the init has no factory)


@pytest.mark.parametrize("cls", HOT, ids=lambda c: c.__name__)
def test_init_sets_every_field(cls: type) -> None:
    fields = dataclasses.fields(cls)
    values = VALUES[cls]
    assert list(values) == [f.name for f in fields]
    made = cls(**values)
    assert {f.name: getattr(made, f.name) for f in fields} == values
    assert made == cls(*values.values())  # by position too
    assert dataclasses.replace(made) == made
    if cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, fields[0].name, None)


def test_defaults_apply() -> None:
    command = Command("NOOP", b"NOOP", b"")
    assert (command.address, command.params, command.violations) == (None, (), ())
    slot = state.Slot(state.Owed.GREETING)
    assert (slot.barrier, slot.command, slot.reply, slot.close) == (False, None, None, None)
    assert slot.direction is Direction.SERVER_TO_CLIENT
