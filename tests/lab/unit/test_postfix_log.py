"""The private Postfix instance's log, read: delivery attempts, outcomes, Message-IDs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice_lab.postfix_log import count_deliveries, message_ids, parse_deliveries

pytestmark = pytest.mark.unit

LOG = """\
Dec  3 20:00:00 h msa1/cleanup[10]: 4AbC: message-id=<one@example.test>
Dec  3 20:00:01 h msa1/smtp[11]: 4AbC: to=<a@mx.test>, relay=127.0.0.9[127.0.0.9]:25, \
delay=0.1, delays=0/0/0/0, dsn=2.0.0, status=sent (250 2.0.0 Ok: queued as X1)
Dec  3 20:00:02 h msa1/smtp[11]: 4AbC: to=<b@mx.test>, orig_to=<B@mx.test>, \
relay=127.0.0.9[127.0.0.9]:25, conn_use=3, delay=0.1, dsn=4.7.0, status=deferred \
(host 127.0.0.9 said: 421 4.7.0 too many connections)
Dec  3 20:00:03 h msa1/bounce[12]: 4AbC: sender non-delivery notification: 5DeF
Dec  3 20:00:04 h msa1/smtp[11]: 5XyZ: to=<c@mx.test>, relay=none, delay=9, \
status=bounced (unknown user)
"""


def test_each_status_line_is_one_attempt_with_its_connection_use_and_reply() -> None:
    records = parse_deliveries(LOG)
    assert [(r.queue_id, r.recipient, r.conn_use, r.status) for r in records] == [
        ("4AbC", "a@mx.test", 1, "sent"),
        ("4AbC", "b@mx.test", 3, "deferred"),
        ("5XyZ", "c@mx.test", 1, "bounced"),
    ]
    assert records[0].text == "250 2.0.0 Ok: queued as X1"
    assert records[1].relay == "127.0.0.9[127.0.0.9]:25"
    assert records[1].text.endswith("421 4.7.0 too many connections")


def test_outcomes_are_counted_and_bounces_kept_whole() -> None:
    counted = count_deliveries(LOG)
    assert (counted.sent, counted.deferred, counted.bounced, counted.expired) == (1, 1, 1, 0)
    assert counted.bounced_lines == (LOG.splitlines()[-1],)


def test_message_ids_by_queue_id() -> None:
    assert message_ids(LOG) == {"4AbC": "one@example.test"}


_words = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="<>,()"),
                 min_size=1, max_size=12)  # fmt: skip


@given(
    queue_id=st.text("0123456789ABCDEFabcdef", min_size=4, max_size=12),
    local=_words,
    use=st.none() | st.integers(1, 999),
    status=st.sampled_from(["sent", "deferred", "bounced", "expired"]),
    reply=st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60),
    noise=st.lists(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)),
)
def test_any_status_line_reads_back_what_was_logged(
    queue_id: str, local: str, use: int | None, status: str, reply: str, noise: list[str]
) -> None:
    used = "" if use is None else f" conn_use={use},"
    line = (f"Dec  3 20:00:00 h msa/smtp[1]: {queue_id}: to=<{local}@mx.test>, "
            f"relay=mx.test[127.0.0.9]:25,{used} delay=1, status={status} ({reply})")  # fmt: skip
    text = "\n".join([*(n for n in noise if "status=" not in n), line])
    (record,) = parse_deliveries(text)
    assert (record.queue_id, record.recipient, record.status, record.text) == (
        queue_id, f"{local}@mx.test", status, reply,
    )  # fmt: skip
    assert record.conn_use == (use or 1)
    assert getattr(count_deliveries(text), status) == 1
