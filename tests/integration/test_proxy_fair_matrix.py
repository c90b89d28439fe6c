"""The MX fault matrix of ``test_proxy_faults.py``, re-run with fair sharing (late binding).

The same lock-step session (``walk``: greeting, EHLO, MAIL, RCPT, DATA, the message and
its dot, QUIT) meets one MX fault at each phase after the greeting (MAIL, RCPT, DATA,
mid-body, the dot, QUIT) x each action (close, reset, stall, 421, 4xx, 5xx, garbage,
extra, and the MX's half-close after its reply), on the connection the transaction
borrows, bound two ways:

* ``reused``: the destination is new, so the session dials for its greeting (a first
  contact) and drives the set-up; the connection idles for its tenant after EHLO and
  the transaction borrows it back at MAIL;
* ``dialled``: the destination is known (another tenant talked to it first), so the
  greeting and EHLO come from memory and the transaction gets a connection the proxy
  dials and sets up itself (greeting, EHLO) before its held MAIL goes out.

Each cell checks what the relay's matrix checks (``allowed``: the client's first
deviation; the ledger; every reply a 4xx, normal, or the MX's own; an unsolicited reply
never taken for an answer; nothing after a 421) and what fair sharing adds: the fault
fired on the borrowed connection, and every slot is free again at the end (no leak,
whatever the MX did, a QUIT it never answers included).

Where fair sharing differs from ``allowed``: the QUIT row. The client's QUIT comes when
no connection is held (it was given back after the transaction), so the proxy answers
it (``221``) and the MX's fault fires on the proxy's own QUIT, when the idle connection
is closed (here after ``idle_timeout``): the client always sees a normal session.

And the 421 to MAIL on a *reused* binding: the connection served the first contact before,
so the MX's 421 ends that connection, not the transaction, which the proxy sends again on
another (Exim's ``smtp_accept_max_per_connection`` looks the same): a normal session.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.fair_helpers import TENANTS, books, fair, session
from tests.integration.proxy_helpers import (
    FAST_TIMEOUTS,
    WAIT,
    sessions,
    transcript_of,
    wait_until,
)
from tests.integration.test_proxy_faults import NORMAL, OK, Walk, allowed, walk

from mailsluice_lab.peers.faults import (
    EXTRA_REPLY,
    MATRIX_ACTIONS,
    Action,
    Fault,
    Phase,
)
from mailsluice_lab.peers.mx import ScriptedMX

pytestmark = pytest.mark.integration

#: The phases after the greeting: the ones a borrowed connection meets.
PHASES = (Phase.MAIL, Phase.RCPT, Phase.DATA, Phase.BODY, Phase.DOT, Phase.QUIT)
ACTIONS = (*MATRIX_ACTIONS, Action.HALF_CLOSE)
BINDINGS = ("reused", "dialled")
WARM = TENANTS[2]  # the tenant that makes the destination known ("dialled")
BYE = "221 2.0.0 Bye"  # the proxy's own answer to QUIT when no connection is held


def fair_allowed(phase: Phase, action: Action, binding: str) -> set[tuple[str, str]]:
    """``allowed`` of the relay's matrix, with fair sharing's two differences: the
    client's QUIT is the proxy's to answer, so the QUIT row is a normal session; and a 421
    to MAIL on a connection used before (``reused``: the first contact's) ends that
    connection, not the transaction, which goes to another one: a normal session too."""
    if phase is Phase.QUIT:
        return {OK}
    if phase is Phase.MAIL and action is Action.REPLY_421 and binding == "reused":
        return {OK}
    return allowed(phase, action)


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.value)
@pytest.mark.parametrize("phase", PHASES, ids=lambda p: p.value)
async def test_fair_fault_matrix(
    proxy_factory, tmp_path: Path, phase: Phase, action: Action, binding: str
) -> None:
    number = 1 if binding == "reused" else 2  # the borrowed connection, in accept order
    fault = Fault(phase, action, after_bytes=1, connection=number)
    settings = fair(idle_timeout=0.3)  # an idle connection gets the proxy's QUIT soon
    async with (
        ScriptedMX(faults=[fault], idle_timeout=5.0) as mx,
        proxy_factory(mx.address, timeouts=FAST_TIMEOUTS, fair=settings) as proxy,
    ):
        if binding == "dialled":
            await session(proxy, WARM)
        run = await walk(proxy, mx, split_body=phase is Phase.BODY)
        assert await wait_until(lambda: len(mx.sessions) >= number, WAIT)
        borrowed = mx.sessions[number - 1]
        assert await wait_until(lambda: bool(borrowed.fired), WAIT), (
            "the fault never fired: the cell tests nothing"
        )
        assert borrowed.fired == [fault]
        # every slot free again: given back, closed (the MX may never answer our QUIT)
        dest = books(proxy)
        assert await wait_until(lambda: dest.in_use == 0, WAIT), dest.tenants()
        assert dest.waiting == 0
    assert proxy.log_writer.dropped == 0
    assert not proxy.services.connections
    deviation = run.deviation
    permitted = fair_allowed(phase, action, binding)
    matches = [p for s, p in permitted if s == deviation[0]]
    assert any(deviation[1].startswith(p) for p in matches), (
        f"client saw {deviation} (steps {run.steps}); allowed {sorted(permitted)}"
    )
    if deviation[1].startswith("421"):  # a 421 (ours or the MX's) ends the session
        assert run.after in (["closed"], ["reset"]), f"after {deviation[1]!r}: {run.after}"
    else:
        assert run.after[-1] in ("closed", "reset"), run.after
    warm = [m for m in mx.ledger if m.mail_from == f"s@{WARM}.test"]
    results = [] if run.result is None else [run.result]
    mx.ledger.assert_no_loss(results, allow_unsubmitted=bool(warm))
    delivered = deviation is OK or deviation[0] == "quit"
    assert len(mx.ledger) - len(warm) == (1 if delivered else 0), run.steps
    _replies_are_accounted(run, mx, borrowed_sent=borrowed.sent)
    _extra_never_consumed(tmp_path)
    # the premise: the transaction borrowed the connection as the binding says
    cell = sessions(tmp_path)[-1]
    notes = [t["text"] for t in transcript_of(tmp_path, cell["id"]) if t["direction"] == "note"]
    if binding == "reused":
        assert any(n.endswith("(transaction 2 on it)") for n in notes), notes
    else:
        assert notes[0].startswith("greeted from"), notes


def _replies_are_accounted(run: Walk, mx: ScriptedMX, *, borrowed_sent: bytes) -> None:
    """Every reply the client got: normal, a 4xx, the proxy's own 221 to QUIT, or the
    MX's own bytes (never a made-up 2xx or 5xx); the unsolicited reply never."""
    sent = b"".join(s.sent for s in mx.sessions).decode("utf-8", "replace")
    for step, out in [*run.steps, *(("after", a) for a in run.after)]:
        if not out[:3].isdigit() or out[0] == "4" or out.startswith(NORMAL.get(step, "-")):
            continue
        if out == BYE:
            continue
        assert out.replace("\n", "\r\n") in sent, f"{step}: {out!r} is neither a 4xx nor the MX's"
    assert EXTRA_REPLY not in run.received, "an unsolicited MX reply reached the client"
    assert borrowed_sent  # (the borrowed connection did speak: the cell used it)


def _extra_never_consumed(tmp_path: Path) -> None:
    """The proxy never took the unsolicited reply for the answer to its own command (a
    set-up's greeting or EHLO, a QUIT), I4."""
    text = EXTRA_REPLY.decode().rstrip("\r\n")
    for logged in sessions(tmp_path):
        lines = transcript_of(tmp_path, logged["id"])
        assert not [t for t in lines if t["direction"] == "s>p" and t["text"] == text], lines


def test_the_matrix_is_complete() -> None:
    """54 cells per binding: the 6 phases after the greeting x 9 actions."""
    assert len(PHASES) * len(ACTIONS) == 54
    assert {a for a in Action if a is not Action.RAW} == set(ACTIONS)
