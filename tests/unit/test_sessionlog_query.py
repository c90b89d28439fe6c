"""The filters of ``mailsluice sessions``: their parsers and their SQL (no database server)."""

from __future__ import annotations

import ipaddress
import re
import socket
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mailsluice.runtime.session.sides import format_address
from mailsluice.sessionlog.query import (
    MAX_TIME,
    CodeRange,
    Endpoint,
    Mailbox,
    QueryError,
    SessionFilter,
    fold_ascii,
    parse_codes,
    parse_endpoint,
    parse_mailbox,
    parse_time,
    parse_tls,
)
from mailsluice.sessionlog.query_sql import MYSQL, POSTGRES, SQLITE, like_pattern, select_sessions

pytestmark = pytest.mark.unit

NOW = 1_714_564_800.0  # 2024-05-01T12:00:00Z
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

# -- times -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01", NOW - 12 * 3600),
        ("2024-05-01T12:00", NOW),
        ("2024-05-01 12:00:00", NOW),
        ("2024-05-01T12:00:00Z", NOW),
        ("2024-05-01T14:00:00+02:00", NOW),
        ("2024-05-01T12:00:00.250Z", NOW + 0.25),
        ("20240501T120000Z", NOW),
        ("  30m ", NOW - 1800),
        ("1h", NOW - 3600),
        ("2d", NOW - 2 * 86400),
        ("1w", NOW - 604800),
        ("90s", NOW - 90),
        ("1d12h", NOW - 36 * 3600),
        ("0s", NOW),
        ("99999999w", 0.0),  # before 1970: 1970
        ("1900-01-01", 0.0),
        ("9999-12-31T23:59:59.999999-05:00", MAX_TIME),
    ],
)
def test_times_absolute_and_ago(text: str, expected: float) -> None:
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize(
    "text", ["", "yesterday", "1", "1.5h", "1H", "1 h", "h", "-1h", "1y", "2024-13-01", "1h ago"]
)
def test_what_is_not_a_time_is_explained(text: str) -> None:
    with pytest.raises(QueryError, match=r"is not a time; write an ISO 8601 time .* \(90s, 30m"):
        parse_time(text, NOW)


aware_datetimes = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(9999, 12, 30)
).flatmap(
    lambda naive: st.integers(-14 * 60, 14 * 60).map(
        lambda minutes: naive.replace(tzinfo=timezone(timedelta(minutes=minutes)))
    )
)


@given(aware_datetimes)
def test_any_iso_time_with_an_offset_is_that_instant(moment: datetime) -> None:
    expected = min(MAX_TIME, max(0.0, moment.timestamp()))
    assert parse_time(moment.isoformat(), NOW) == expected


@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 12, 30)))
def test_an_iso_time_without_an_offset_is_utc(moment: datetime) -> None:
    assert parse_time(moment.isoformat(), NOW) == moment.replace(tzinfo=UTC).timestamp()
    assert parse_time(moment.isoformat(sep=" "), NOW) == moment.replace(tzinfo=UTC).timestamp()


durations = st.lists(
    st.tuples(st.integers(0, 10**6), st.sampled_from(sorted(UNIT_SECONDS))), min_size=1, max_size=4
)


@given(durations, st.floats(0, 4e9, allow_nan=False))
def test_a_duration_means_that_long_before_now(parts: list[tuple[int, str]], now: float) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    seconds = sum(n * UNIT_SECONDS[unit] for n, unit in parts)
    assert parse_time(text, now) == max(0.0, now - seconds)


@given(durations, durations)
def test_a_longer_duration_is_never_later(
    a: list[tuple[int, str]], b: list[tuple[int, str]]
) -> None:
    def seconds(parts: list[tuple[int, str]]) -> int:
        return sum(n * UNIT_SECONDS[unit] for n, unit in parts)

    def text(parts: list[tuple[int, str]]) -> str:
        return "".join(f"{n}{unit}" for n, unit in parts)

    assume(seconds(a) <= seconds(b))
    assert parse_time(text(a), NOW) >= parse_time(text(b), NOW)


@given(st.text())
def test_any_text_is_a_time_in_range_or_a_query_error(text: str) -> None:
    try:
        at = parse_time(text, NOW)
    except QueryError as exc:
        message = str(exc)
    else:
        assert 0.0 <= at <= MAX_TIME
        return
    assert "is not a time" in message


# -- addresses -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("192.0.2.1", Endpoint("192.0.2.1")),
        ("192.0.2.1:25", Endpoint("192.0.2.1", 25)),
        ("2001:DB8::1", Endpoint("[2001:db8::1]")),
        ("2001:db8:0:0:0:0:0:1", Endpoint("[2001:db8::1]")),
        ("[2001:db8::1]", Endpoint("[2001:db8::1]")),
        ("[2001:db8::1]:587", Endpoint("[2001:db8::1]", 587)),
        ("::ffff:192.0.2.1", Endpoint("[::ffff:192.0.2.1]")),
        ("MX.Example:25", Endpoint("mx.example", 25)),
        (" mx.example ", Endpoint("mx.example")),
    ],
)
def test_endpoints(text: str, expected: Endpoint) -> None:
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not an address"),
        ("192.0.2.1:", "gives no port"),
        ("192.0.2.1:0", "'0' is not a port"),
        ("192.0.2.1:65536", "'65536' is not a port"),
        ("192.0.2.1:smtp", "'smtp' is not a port"),
        ("[2001:db8::1", r"write \[IPV6\]:PORT"),
        ("[2001:db8::1]x", r"write \[IPV6\]:PORT"),
        ("[2001:db8::1]:", "gives no port"),
        ("[mx.example]:25", "is not an IPv6 address"),
        ("[192.0.2.1]:25", r"is not an IPv6 address; write it without \[ \]"),
        ("2001:db8:::1", "is not an IPv6 address"),
        ("a b", "is not an address"),
        ("10.0.0.0/8", "is not an address"),
    ],
)
def test_bad_endpoints_are_explained(text: str, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        parse_endpoint(text)


@given(st.ip_addresses(), st.integers(1, 65535))
def test_an_endpoint_matches_the_address_as_the_proxy_logs_it(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int
) -> None:
    # the peer's address as the kernel's getpeername gives it (inet_ntop), then as logged
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    peer = socket.inet_ntop(family, address.packed)
    logged = format_address((peer, port))
    host_only = logged.rpartition(":")[0]
    for text in (peer, str(address), logged, host_only):
        endpoint = parse_endpoint(text)
        expected = logged if endpoint.port is not None else host_only + ":"
        assert endpoint.text == expected, text


@pytest.mark.parametrize(
    ("text", "null_allowed", "expected"),
    [
        ("Bob@Example.COM", False, Mailbox("bob@example.com")),
        ("<bob@example.com>", False, Mailbox("bob@example.com")),
        ("@Example.COM", False, Mailbox("@example.com", domain=True)),
        ("<>", True, Mailbox("")),
        ("", True, Mailbox("")),
        ("Ünïcode@Example.COM", False, Mailbox("Ünïcode@example.com")),  # ASCII folded only
    ],
)
def test_mailboxes(text: str, null_allowed: bool, expected: Mailbox) -> None:
    assert parse_mailbox(text, null_allowed=null_allowed) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<>", "an empty address matches no recipient"),
        ("a b@c", "is not an address"),
        ("<a@b", "is not an address"),
        ("@", "write @domain"),
        ("@a@b", "write @domain"),
    ],
)
def test_bad_recipients_are_explained(text: str, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        parse_mailbox(text, null_allowed=False)


@given(st.text())
def test_folding_lowers_ascii_letters_only(text: str) -> None:
    folded = fold_ascii(text)
    assert len(folded) == len(text)
    for before, after in zip(text, folded, strict=True):
        assert after == (before.lower() if "A" <= before <= "Z" else before)


# -- codes and TLS --------------------------------------------------------------------------


@given(st.integers(200, 599))
def test_a_code_matches_itself_its_decade_and_its_class(code: int) -> None:
    text = str(code)
    assert parse_codes(text) == (CodeRange(code, code),)
    decade = parse_codes(text[:2] + "x")[0]
    klass = parse_codes(text[0] + "XX")[0]
    assert code in decade
    assert code in klass
    assert (decade.high - decade.low, klass.high - klass.low) == (9, 99)
    assert code + 100 not in klass
    assert code - 100 not in klass


def test_code_lists() -> None:
    assert parse_codes("4xx, 5xx,4xx") == (CodeRange(400, 499), CodeRange(500, 599))
    for bad in ("", "600", "199", "2x0", "25", "2500", "ok", "4xx;5xx"):
        with pytest.raises(QueryError, match=r"is not a reply code; write a code \(250\)"):
            parse_codes(bad)


def test_tls() -> None:
    assert [parse_tls(t) for t in ("yes", "YES", "no", "No ", "true", "0")] == [
        True, True, False, False, True, False,
    ]  # fmt: skip
    with pytest.raises(QueryError, match=r"write yes .* or no"):
        parse_tls("maybe")


def test_since_after_until_is_refused() -> None:
    with pytest.raises(QueryError, match="--since is later than --until"):
        SessionFilter(since=NOW, until=NOW - 1)
    assert SessionFilter(since=NOW, until=NOW).since == NOW  # empty, but not contradictory


# -- SQL ------------------------------------------------------------------------------------


def test_like_patterns_are_literal() -> None:
    assert like_pattern("a%b_c!d") == "a!%b!_c!!d"
    assert like_pattern("plain@example.org") == "plain@example.org"


texts = st.text(min_size=1, max_size=30)
filters = st.builds(
    SessionFilter,
    since=st.none() | st.floats(0, 2e9),
    client=st.none() | st.builds(Endpoint, texts, st.none() | st.integers(1, 65535)),
    destination=st.none() | st.builds(Endpoint, texts, st.none() | st.integers(1, 65535)),
    sender=st.none() | st.builds(Mailbox, texts, st.booleans()),
    recipient=st.none() | st.builds(Mailbox, texts, st.booleans()),
    codes=st.lists(
        st.builds(CodeRange, st.integers(200, 599), st.integers(200, 599)), max_size=3
    ).map(tuple),
    tls=st.none() | st.booleans(),
)


def _shape(where: SessionFilter) -> SessionFilter:
    """The same filters with every value replaced by a fixed one."""

    def endpoint(e: Endpoint | None) -> Endpoint | None:
        return None if e is None else Endpoint("h", None if e.port is None else 1)

    def mailbox(m: Mailbox | None) -> Mailbox | None:
        return None if m is None else Mailbox("m", m.domain)

    return SessionFilter(
        since=None if where.since is None else 0.0,
        client=endpoint(where.client),
        destination=endpoint(where.destination),
        sender=mailbox(where.sender),
        recipient=mailbox(where.recipient),
        codes=tuple(CodeRange(200, 200) for _ in where.codes),
        tls=where.tls,
    )


@given(filters, st.integers(-1, 100))
def test_values_are_always_parameters_never_sql(where: SessionFilter, limit: int) -> None:
    for dialect in (SQLITE, POSTGRES, MYSQL):
        sql, params = select_sessions(dialect, "id", where, limit)
        same_sql, same_count = select_sessions(dialect, "id", _shape(where), limit)
        assert sql == same_sql  # the text depends on which filters are given, not their values
        assert len(params) == len(same_count)
        if dialect is SQLITE:
            assert sql.count("?") == len(params)
        elif dialect is MYSQL:
            assert sql.count("%s") == len(params)
            assert "%" not in sql.replace("%s", "")  # PyMySQL formats the text with %
        else:
            assert re.findall(r"\$(\d+)", sql) == [str(n + 1) for n in range(len(params))]


def test_the_sql_of_every_filter() -> None:
    where = SessionFilter(
        since=NOW,
        until=NOW + 60,
        client=Endpoint("192.0.2.1"),
        destination=Endpoint("[2001:db8::1]", 25),
        sender=Mailbox(""),
        recipient=Mailbox("@example.org", domain=True),
        codes=(CodeRange(500, 599),),
        tls=False,
    )
    sql, params = select_sessions(SQLITE, "s.id", where, 10)
    assert sql == (
        "SELECT s.id FROM sessions s WHERE (s.started_at >= ?) AND (s.started_at < ?) "
        "AND (lower(s.client) LIKE ? ESCAPE '!') AND (lower(s.destination) LIKE ? ESCAPE '!') "
        "AND (EXISTS (SELECT 1 FROM transactions t WHERE t.session_id = s.id "
        "AND (lower(t.mail_from) LIKE ? ESCAPE '!'))) "
        "AND (EXISTS (SELECT 1 FROM transactions t CROSS JOIN json_each(t.rcpt_to) AS r "
        "WHERE t.session_id = s.id AND (lower(r.value) LIKE ? ESCAPE '!'))) "
        "AND ((s.final_code BETWEEN ? AND ? OR EXISTS (SELECT 1 FROM transactions t "
        "WHERE t.session_id = s.id AND (t.reply_code BETWEEN ? AND ?)))) "
        "AND (s.tls_version IS NULL AND s.ended_at IS NOT NULL) "
        "ORDER BY s.started_at DESC, s.id DESC LIMIT ?"
    )
    assert params == [
        NOW, NOW + 60, "192.0.2.1:%", "[2001:db8::1]:25", "", "%@example.org",
        500, 599, 500, 599, 10,
    ]  # fmt: skip
    pg_sql, pg_params = select_sessions(POSTGRES, "s.id", where, 0)
    assert 'lower(s.client COLLATE "C") LIKE $3' in pg_sql
    assert "unnest(t.rcpt_to) AS r(a)" in pg_sql
    assert pg_sql.endswith("ORDER BY s.started_at DESC NULLS LAST, s.id DESC")  # no LIMIT: all
    assert pg_params[0] == datetime(2024, 5, 1, 12, tzinfo=UTC)
    my_sql, my_params = select_sessions(MYSQL, "s.id", where, 0)
    assert "REPLACE(REPLACE(s.client, 'A', 'a'), 'B', 'b')" in my_sql
    assert "lower(" not in my_sql.lower()  # MariaDB's LOWER folds every Unicode letter
    assert "JSON_TABLE(t.rcpt_to, '$[*]' COLUMNS" in my_sql
    assert my_params[0] == datetime(2024, 5, 1, 12)  # naive UTC, for DATETIME(6)


# -- the semantics, on SQLite against a model --------------------------------------------


mailbox_texts = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="<>"), min_size=1
).filter(lambda t: not any(c.isspace() for c in t) and t.strip() == t)


@given(mailbox_texts)
def test_a_mailbox_is_its_text_folded_with_or_without_brackets(text: str) -> None:
    if text.startswith("@") and (text == "@" or "@" in text[1:]):
        with pytest.raises(QueryError, match="write @domain"):
            parse_mailbox(text, null_allowed=False)
        return
    plain = parse_mailbox(text, null_allowed=False)
    assert parse_mailbox(f"<{text}>", null_allowed=False) == plain
    assert plain.text == fold_ascii(text)
    assert plain.domain == text.startswith("@")
