"""The interop matrix's own logic: probes, verdicts, rows, and the MTA log parsers."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support import interop
from tests.support.exim_msa import EximMSA, LogEvent
from tests.support.interop import REUSE, SINGLE, Confirmation, judge, make_probe, rows
from tests.support.postfix_mx import StoredMessage, peak_sessions, split_message

from mailsluice_lab.postfix import PostfixMSA

pytestmark = pytest.mark.unit

DOMAIN = "mx-default.example"


def stored(probe: interop.Probe, rcpt: str, queue_id: str, **changes: object) -> StoredMessage:
    fields: dict[str, object] = {
        "recipient": rcpt,
        "queue_id": queue_id,
        "message_id": probe.message_id,
        "protocol": "ESMTPS",
        "body": probe.body,
        "path": Path("/nowhere") / queue_id,
    }
    fields.update(changes)
    return StoredMessage(**fields)  # type: ignore[arg-type]


def sent(probe: interop.Probe, rcpt: str, queue_id: str, **changes: object) -> Confirmation:
    fields: dict[str, object] = {
        "token": probe.token,
        "recipient": rcpt,
        "outcome": "sent",
        "reply": f"250 2.0.0 Ok: queued as {queue_id}",
    }
    fields.update(changes)
    return Confirmation(**fields)  # type: ignore[arg-type]


def test_probe_kinds_carry_what_they_promise() -> None:
    dots = make_probe("t-1", "dot-lines", DOMAIN, SINGLE)
    assert b"\n.\n" in dots.body
    assert dots.body.endswith(b"\n.\n")
    assert not make_probe("t-2", "dot-lines", DOMAIN, SINGLE, last_line_dot=False).body.endswith(
        b"\n.\n"
    )
    assert any(byte >= 0x80 for byte in make_probe("t-3", "8-bit", DOMAIN, SINGLE).body)
    big = make_probe("t-4", "200 KB", DOMAIN, SINGLE)
    assert len(big.body) >= 200 * 1024
    assert max(len(line) for line in big.body.split(b"\n")) <= 998
    assert len(make_probe("t-5", "multi-recipient", DOMAIN, SINGLE).recipients) == 3
    assert split_message(big.content)[1] == big.body
    with pytest.raises(ValueError, match="unknown kind"):
        make_probe("t-6", "huge", DOMAIN, SINGLE)


def test_a_clean_delivery_has_no_problems() -> None:
    probe = make_probe("t-1", "multi-recipient", DOMAIN, SINGLE)
    copies = [stored(probe, rcpt, "AB12") for rcpt in probe.recipients]
    confirmations = [sent(probe, rcpt, "AB12") for rcpt in probe.recipients]
    [verdict] = judge([probe], copies, confirmations)
    assert verdict.problems == []
    assert (verdict.delivered, verdict.duplicates, verdict.deferrals, verdict.sent) == (3, 0, 0, 3)


def test_a_deferral_and_a_second_copy_are_counted_and_reported() -> None:
    probe = make_probe("t-1", "plain", DOMAIN, SINGLE)
    [rcpt] = probe.recipients
    copies = [stored(probe, rcpt, "AB12"), stored(probe, rcpt, "CD34")]
    confirmations = [
        sent(probe, rcpt, "", outcome="deferred", reply="Remote host closed connection"),
        sent(probe, rcpt, "CD34"),
    ]
    [verdict] = judge([probe], copies, confirmations)
    assert (verdict.delivered, verdict.duplicates, verdict.deferrals) == (1, 1, 1)
    assert f"{rcpt}: 2 copies at the MX" in verdict.problems
    assert any("deferred: Remote host closed" in p for p in verdict.problems)


@pytest.mark.parametrize(
    ("copy_changes", "confirmation_changes", "problem"),
    [
        ({"body": b"changed\n"}, {}, "body differs"),
        ({"protocol": "ESMTP"}, {}, "not TLS"),
        ({}, {"reply": "250 2.0.0 Ok"}, "no queue id"),
        ({}, {"reply": "250 2.0.0 Ok: queued as ZZ99"}, "confirmed as ZZ99"),
        ({}, {"outcome": "bounced"}, "bounced"),
        ({"recipient": f"eve@{DOMAIN}"}, {}, "stranger"),
    ],
)
def test_each_defect_is_a_problem(
    copy_changes: dict[str, object], confirmation_changes: dict[str, object], problem: str
) -> None:
    probe = make_probe("t-1", "plain", DOMAIN, SINGLE)
    [rcpt] = probe.recipients
    [verdict] = judge(
        [probe],
        [stored(probe, rcpt, "AB12", **copy_changes)],
        [sent(probe, rcpt, "AB12", **confirmation_changes)],
    )
    assert any(problem in p for p in verdict.problems), verdict.problems


def test_missing_copy_queued_and_frozen_are_problems() -> None:
    probe = make_probe("t-1", "plain", DOMAIN, SINGLE)
    [verdict] = judge([probe], [], [], still_queued=["t-1"], frozen=["t-1"])
    assert verdict.delivered == 0
    assert {"still on the MTA's queue", "frozen on the MTA's queue"} <= set(verdict.problems)
    assert any("0 copies" in p for p in verdict.problems)
    assert any("logged 0 deliveries" in p for p in verdict.problems)


def test_rows_fold_each_probe_into_its_options_and_all() -> None:
    a = make_probe("t-1", "plain", DOMAIN, SINGLE)
    b = make_probe("t-2", "multi-recipient", "mx-nopipelining.example", REUSE)
    verdicts = judge(
        [a, b],
        [stored(a, a.recipients[0], "A1"), stored(a, a.recipients[0], "A2")],
        [sent(a, a.recipients[0], "A1", outcome="deferred"), sent(a, a.recipients[0], "A2")],
    )
    by_option = {row.option: row for row in rows("MTA", verdicts)}
    assert by_option["all"].recipients == 4
    assert by_option["all"].delivered == 1
    assert by_option["all"].duplicates == 1
    assert by_option["all"].deferrals == 1
    assert by_option["all"].problems == 2
    assert by_option[SINGLE].duplicates == 1
    assert by_option[REUSE].delivered == 0
    assert by_option["MX without PIPELINING"].recipients == 3
    records = [row.__dict__ for row in rows("MTA", verdicts)]
    assert "| MTA | all | 1/4 | 1 | 1 |" in interop.render(records)
    pivot = interop.render_pivot([*records, {**records[-1], "mta": "Other", "option": "all"}])
    head, _, mta, other = pivot.splitlines()
    assert head.startswith("| MTA | MX offers PIPELINING + CHUNKING | MX without PIPELINING |")
    assert head.endswith("| all |")
    assert mta.endswith("| 1/4 · 1 · 1 |")
    assert other.startswith("| Other | n/a |")


def test_exim_log_lines_are_parsed() -> None:
    exim = EximMSA(routes={DOMAIN: "10.0.0.2"}, interface="10.0.0.1")
    try:
        exim.log_dir.mkdir()
        exim.mainlog.write_text(
            "2026-12-01 14:59:35 1xYPKQ-0004sT-0I <= web@tenant.example U=root P=local S=608 "
            "id=t-1@tenant.example\n"
            "2026-12-01 14:59:35 1xYPKQ-0004sT-0I == bob@mx-default.example R=mx "
            "T=remote_smtp defer (-18) H=10.251.2.5 [10.251.2.5]:25* DT=0s: Remote host closed "
            "connection in response to end of data\n"
            "2026-12-01 14:59:36 1xYPKQ-0004sT-0I => bob@mx-default.example R=mx T=remote_smtp "
            'S=608 H=10.251.2.5 [10.251.2.5]:25* C="250 2.0.0 Ok: queued as 045E820C072" DT=0s\n'
            "2026-12-01 14:59:36 1xYPKQ-0004sT-0I -> carol@mx-default.example R=mx "
            'T=remote_smtp S=608 H=10.251.2.5 [10.251.2.5]:25 C="250 2.0.0 Ok: queued as 04"\n'
            "2026-12-01 14:59:36 1xYPKQ-0004sT-0I Completed\n"
            "2026-12-01 14:59:37 1xYPKR-0004sT-0J Frozen (delivery error message)\n"
        )
        events: list[LogEvent] = exim.log_events()
        assert [e.flag for e in events] == ["<=", "==", "=>", "->"]
        assert events[0].fields["id"] == "t-1@tenant.example"
        assert events[2].fields["C"] == "250 2.0.0 Ok: queued as 045E820C072"
        assert events[2].fields["H"] == "10.251.2.5 [10.251.2.5]:25*"
        assert [e.reused for e in events[1:]] == [True, True, False]
        assert [line.split()[2] for line in exim.frozen_in_log()] == ["1xYPKR-0004sT-0J"]
    finally:
        exim.stop()


def test_postfix_status_lines_are_parsed() -> None:
    msa = PostfixMSA(relayhost=None, name="parse", host="127.0.0.2", port=2525)
    try:
        msa.maillog.write_text(
            "Dec 01 15:00:12 h postfix-x/smtp[1]: B7AAF21054D: to=<bob@mx.example>, "
            "relay=10.251.2.4[10.251.2.4]:25, conn_use=3, delay=0.11, delays=0/0.11/0/0, "
            "dsn=2.0.0, status=sent (250 2.0.0 Ok: queued as D2CCC21054B)\n"
            "Dec 01 15:00:13 h postfix-x/smtp[1]: C2EB921054C: to=<carol@mx.example>, "
            "orig_to=<c@mx.example>, relay=none, delay=1, delays=0/0/1/0, dsn=4.4.1, "
            "status=deferred (connect to 10.251.2.4[10.251.2.4]:25: Connection refused)\n"
        )
        first, second = msa.delivery_records()
        assert (first.queue_id, first.recipient, first.conn_use, first.status) == (
            "B7AAF21054D",
            "bob@mx.example",
            3,
            "sent",
        )
        assert first.text == "250 2.0.0 Ok: queued as D2CCC21054B"
        assert (second.recipient, second.conn_use, second.status) == (
            "carol@mx.example",
            1,
            "deferred",
        )
    finally:
        msa.stop()


def _smtpd(pid: int, text: str) -> str:
    return f"Dec 07 15:17:45 mx postfix-anvil/smtpd[{pid}]: {text}"


def _session(pid: int, queue_id: str) -> list[str]:
    return [
        _smtpd(pid, "connect from unknown[10.251.2.1]"),
        _smtpd(pid, "Anonymous TLS connection established from unknown[10.251.2.1]: TLSv1.3"),
        _smtpd(pid, f"{queue_id}: client=unknown[10.251.2.1]"),
    ]


def test_postfix_peak_counts_a_session_from_its_line_after_anvil() -> None:
    """smtpd logs ``connect from`` before asking anvil and tells anvil of an end before
    it logs ``disconnect from``: a connection let in as another ended can log its
    connect first. Counted from its next line, it is not a fourth; a real fourth is."""
    three = _session(1, "A1") + _session(2, "B2") + _session(3, "C3")
    raced = [
        *three,
        _smtpd(4, "connect from unknown[10.251.2.1]"),  # in before 1's end is logged
        _smtpd(1, "disconnect from unknown[10.251.2.1] ehlo=2 quit=1 commands=3"),
        _smtpd(4, "Anonymous TLS connection established from unknown[10.251.2.1]: TLSv1.3"),
    ]
    assert peak_sessions(raced) == 3
    fourth = [
        *three,
        *_session(4, "D4"),
        _smtpd(1, "disconnect from unknown[10.251.2.1] ehlo=2 quit=1 commands=3"),
    ]
    assert peak_sessions(fourth) == 4
    assert peak_sessions(fourth, client="10.9.9.9") == 0
    refused = [
        *three,
        _smtpd(4, "connect from unknown[10.251.2.1]"),
        _smtpd(4, "warning: Connection concurrency limit exceeded: 4 from unknown[10.251.2.1]"),
        _smtpd(4, "disconnect from unknown[10.251.2.1] commands=0/0"),
    ]
    assert peak_sessions(refused) == 3
