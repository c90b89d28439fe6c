"""The dataclasses made for every relayed line have their ``__init__`` written out (issue
25: mypyc compiles it, while the one ``dataclass`` generates runs as Python, about three
times the instructions). Written out, it must stay the generated one: the same
parameters in the same order with the same defaults (a field with a default factory: None,
which makes a fresh default), every field set, frozen still frozen. The session log's
records (NamedTuples) are built with ``tuple.__new__`` for the same reason: their fields
are checked by name here."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from mailsluice.native import build
from mailsluice.policy.fairshare import Grant
from mailsluice.relay import actions as act
from mailsluice.relay import events as ev
from mailsluice.relay import state
from mailsluice.relay.accounting import Account, Transaction
from mailsluice.relay.records import Direction, TranscriptChunk
from mailsluice.runtime.fair import destinations
from mailsluice.runtime.session.opening import Opened
from mailsluice.scheduling.orders import Take
from mailsluice.smtp.commands import Command
from mailsluice.smtp.data import BodyChunk
from mailsluice.smtp.lines import Line
from mailsluice.smtp.replies import Reply

pytestmark = pytest.mark.unit

HOT = [
    Line, act.SendToClient, act.SendToServer, act.Log, Reply, Command, state.Slot, state.Sent,
    act.CloseClient, act.SetTimer, act.ReusedUpstream, act.ReleaseServer, act.AcquireServer,
    ev.ServerReused, BodyChunk, Grant, Take, destinations._Waiter, Transaction,
]  # fmt: skip
#: written out too, but their fields' values are whole connections: the signature only
HOT_SIGNATURE_ONLY = [destinations.Idle, Opened]


_reply = Reply(250, (b"ok",))
_command = Command("RCPT", b"RCPT TO:<a@b>", b"TO:<a@b>")
_slot = state.Slot(state.Owed.RCPT)
_upstream = act.UpstreamState(_reply, "EHLO a", Reply(250, (b"b",)), None)
_reused = act.ReusedUpstream(_upstream, "192.0.2.1:25", 1)


def _granted(idle: destinations.Idle | None, hold: destinations.Hold) -> None:
    pass


def _failed() -> None:
    pass


def _declined(text: str) -> None:
    pass


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
    act.CloseClient: {"linger": False},
    act.SetTimer: {"seconds": 3.5, "on_server": True},
    act.ReusedUpstream: {
        "state": _upstream, "source": "192.0.2.1:25", "sessions": 3, "hello_name": "h.example",
    },
    act.ReleaseServer: {"state": _upstream, "keep": False},
    act.AcquireServer: {"sender": "a@b", "recipient": "c@d"},
    ev.ServerReused: {"upstream": _reused},
    BodyChunk: {"forward": b"x\r\n", "done": True, "rest": b"QUIT\r\n"},
    Grant: {"ticket": 7, "tenant": "t", "reuse": True},
    Take: {"ticket": 7, "tenant": "t", "conn": 2, "per_connection": 5},
    destinations._Waiter: {"granted": _granted, "failed": _failed, "declined": _declined},
    Transaction: {
        "started_at": 1.5, "mail_from": "a@b", "rcpt_to": ["c@d"], "accepted": ["e@f"],
        "mail_accepted": True, "size": 9, "params": ("SIZE=9",),
    },
}  # fmt: skip


@pytest.mark.skipif(build() == "compiled", reason="a compiled __init__ shows no signature")
@pytest.mark.parametrize("cls", HOT + HOT_SIGNATURE_ONLY, ids=lambda c: c.__name__)
def test_init_takes_the_fields_in_order_with_their_defaults(cls: type) -> None:
    fields = dataclasses.fields(cls)
    params = list(inspect.signature(vars(cls)["__init__"]).parameters.values())[1:]  # (self)
    assert [p.name for p in params] == [f.name for f in fields]
    for param, field in zip(params, fields, strict=True):
        assert param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        if field.default_factory is not dataclasses.MISSING:
            assert param.default is None, field.name  # None: the factory's value
            continue
        missing = field.default is dataclasses.MISSING
        expected = inspect.Parameter.empty if missing else field.default
        assert param.default == expected, field.name


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
    txn = Transaction(1.0, "a@b")
    assert (txn.rcpt_to, txn.accepted, txn.mail_accepted, txn.size, txn.params) == (
        [],
        [],
        False,
        0,
        (),
    )
    assert txn.rcpt_to is not Transaction(1.0, "a@b").rcpt_to  # a fresh list each
    assert (act.CloseClient().linger, act.AcquireServer().sender) == (True, "")
    assert Take(1, "t", 0).per_connection is None
    assert destinations._Waiter(_granted).failed is None


def test_the_records_have_their_fields_by_name() -> None:
    account = Account("s1", 100.0, wall=1000.0)
    opened = account.opened("192.0.2.9:4000", "192.0.2.1:25", "192.0.2.2", "gw")
    assert opened == type(opened)(
        session_id="s1", at=1100.0, client="192.0.2.9:4000", destination="192.0.2.1:25",
        source_ip="192.0.2.2", gateway="gw",
    )  # fmt: skip
    account.line(Direction.CLIENT_TO_SERVER, "MAIL FROM:<a@b>", 101.0)
    chunk = account.take_lines()
    assert chunk == TranscriptChunk(session_id="s1", lines=((1, 1101.0, "c>s", "MAIL FROM:<a@b>"),))
    account.start_transaction(b"a@b", 101.0, ("SIZE=9",))
    account.add_recipient(b"c@d")
    ended = account.end_transaction("delivered", Reply(250, (b"queued",)), 102.0)
    assert ended is not None
    assert ended._asdict() == {
        "session_id": "s1", "seq": 1, "started_at": 1101.0, "ended_at": 1102.0,
        "mail_from": "a@b", "rcpt_to": ("c@d",), "accepted_rcpt_to": (), "size": 0,
        "reply_code": 250, "reply_text": "queued", "outcome": "delivered",
    }  # fmt: skip
    account.helo, account.tls = "h.example", ("TLSv1.3", "AES", True)
    account.client_tls = ("TLSv1.2", "CHACHA")
    closed = account.closed("quit", 103.0)
    assert closed._asdict() == {
        "session_id": "s1", "at": 1103.0, "helo": "h.example", "tls_version": "TLSv1.3",
        "tls_cipher": "AES", "tls_verified": True, "messages": account.messages,
        "bytes": account.relayed_bytes, "final_code": account.final_code,
        "connect_to_354_ms": None, "reason": "quit", "client_tls_version": "TLSv1.2",
        "client_tls_cipher": "CHACHA",
    }  # fmt: skip
