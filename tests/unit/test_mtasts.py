"""MTA-STS, the pure part (``policy.tls.mtasts``): the TXT record, the policy text, MX
patterns and the cache's plan."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.policy.tls.model import StsMode, StsPolicy
from mailsluice.policy.tls.mtasts import (
    MAX_AGE_LIMIT,
    CachedPolicy,
    Step,
    StsPolicyError,
    fallback,
    mx_matches,
    parse_policy,
    parse_sts_record,
    plan,
    policy_allows,
    render_policy,
    sts_record_id,
)

pytestmark = pytest.mark.unit

# -- the TXT record -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([[b"v=STSv1; id=20160831085700Z;"]], "20160831085700Z"),
        ([[b"v=STSv1; id=abc"]], "abc"),
        ([[b"v = STSv1 ;id = abc ; "]], "abc"),
        ([[b"v=STSv1; ", b"id=split"]], "split"),  # strings concatenated
        ([[b"v=spf1 -all"], [b"v=STSv1; id=one"]], "one"),  # others set aside
        ([[b"v=STSv1; id=x; ext=value"]], "x"),  # an extension
        ([[b"v=STSv1; id=one"], [b"v=STSv1; id=two"]], None),  # two records: none
        ([[b"v=STSv1;"]], None),  # no id
        ([[b"v=STSv1; id=" + b"a" * 33]], None),  # id too long
        ([[b"v=STSv1; id=not-alnum"]], None),
        ([[b"v=STSv10; id=abc"]], None),
        ([[b"id=abc; v=STSv1"]], None),  # the version first
        ([], None),
    ],
)
def test_the_txt_record_gives_the_id_or_none(
    records: list[list[bytes]], expected: str | None
) -> None:
    assert sts_record_id(records) == expected


@given(st.lists(st.lists(st.binary(max_size=40), max_size=3), max_size=3))
def test_any_txt_answer_gives_an_id_or_none(records: list[list[bytes]]) -> None:
    found = sts_record_id(records)
    assert found is None or (1 <= len(found) <= 32 and found.isalnum())


@given(st.text(max_size=80))
def test_the_record_parser_raises_only_its_own_error(text: str) -> None:
    try:
        parse_sts_record(text)
    except StsPolicyError:
        pass


@given(st.from_regex(r"[A-Za-z0-9]{1,32}", fullmatch=True), st.sampled_from(["", ";", " ; "]))
def test_a_valid_record_round_trips_its_id(ident: str, end: str) -> None:
    assert parse_sts_record(f"v=STSv1; id={ident}{end}") == ident


# -- the policy text ----------------------------------------------------------------------

RFC_EXAMPLE = "version: STSv1\nmode: enforce\nmx: mail.example.com\nmx: *.example.net\nmx: backupmx.example.com\nmax_age: 604800\n"  # noqa: E501


def test_the_rfc_example_parses() -> None:
    policy = parse_policy(RFC_EXAMPLE, "id1")
    assert policy == StsPolicy(
        id="id1",
        mode=StsMode.ENFORCE,
        mx=("mail.example.com", "*.example.net", "backupmx.example.com"),
        max_age=604800,
        text=tuple(RFC_EXAMPLE.splitlines()),
    )
    assert parse_policy(RFC_EXAMPLE.replace("\n", "\r\n"), "id1") == policy


def test_unknown_keys_are_ignored_and_the_first_of_a_repeated_key_counts() -> None:
    text = RFC_EXAMPLE + "future: thing\nmode: none\n"
    policy = parse_policy(text, "x")
    assert policy.mode is StsMode.ENFORCE
    assert policy.text[-2:] == ("future: thing", "mode: none")


def test_mode_none_needs_no_mx() -> None:
    policy = parse_policy("version: STSv1\nmode: none\nmax_age: 86400", "x")
    assert (policy.mode, policy.mx) == (StsMode.NONE, ())


@pytest.mark.parametrize(
    "text",
    [
        "",
        "mode: enforce\nmx: a.example\nmax_age: 1\n",  # no version
        "version: STSv2\nmode: enforce\nmx: a.example\nmax_age: 1\n",
        "version: STSv1\nmode: Enforce\nmx: a.example\nmax_age: 1\n",  # case matters
        "version: STSv1\nmode: enforce\nmax_age: 1\n",  # no mx
        "version: STSv1\nmode: enforce\nmx: a.example\n",  # no max_age
        f"version: STSv1\nmode: enforce\nmx: a.example\nmax_age: {MAX_AGE_LIMIT + 1}\n",
        "version: STSv1\nmode: enforce\nmx: a.example\nmax_age: -1\n",
        "version: STSv1\nmode: enforce\nmx: a..example\nmax_age: 1\n",
        "version: STSv1\nmode: enforce\nmx: a.example\nmax_age: 1\ngarbage\n",
        "version: STSv1\rmode: enforce\rmx: a.example\rmax_age: 1\r",  # bare CR
        "version : STSv1\nmode: enforce\nmx: a.example\nmax_age: 1\n",
    ],
)
def test_invalid_policies_are_refused(text: str) -> None:
    with pytest.raises(StsPolicyError):
        parse_policy(text, "x")


@given(st.text(max_size=300))
def test_the_policy_parser_raises_only_its_own_error(text: str) -> None:
    try:
        policy = parse_policy(text, "x")
    except StsPolicyError:
        return
    assert 0 <= policy.max_age <= MAX_AGE_LIMIT
    assert policy.mx or policy.mode is StsMode.NONE


_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_domain = st.lists(_label, min_size=1, max_size=4).map(".".join)
_pattern = st.one_of(_domain, _domain.map(lambda d: f"*.{d}"))


@given(
    st.sampled_from(list(StsMode)),
    st.lists(_pattern, min_size=1, max_size=5),
    st.integers(min_value=0, max_value=MAX_AGE_LIMIT),
    st.booleans(),
)
def test_valid_policies_round_trip(mode: StsMode, mx: list[str], max_age: int, lf: bool) -> None:
    text = render_policy(StsPolicy(id="i", mode=mode, mx=tuple(mx), max_age=max_age))
    if lf:
        text = text.replace("\r\n", "\n")
    parsed = parse_policy(text, "i")
    assert (parsed.mode, parsed.mx, parsed.max_age) == (mode, tuple(mx), max_age)
    assert parse_policy(render_policy(parsed), "i") == parsed


# -- MX patterns --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "pattern", "matches"),
    [
        ("mail.example.com", "mail.example.com", True),
        ("MAIL.Example.com.", "mail.example.com", True),
        ("mx1.example.net", "*.example.net", True),
        ("a.b.example.net", "*.example.net", False),  # one label only
        ("example.net", "*.example.net", False),
        (".example.net", "*.example.net", False),
        ("mail.example.org", "mail.example.com", False),
        ("xexample.net", "*.example.net", False),
    ],
)
def test_mx_patterns(host: str, pattern: str, matches: bool) -> None:
    assert mx_matches(host, pattern) is matches


def test_a_policy_allows_its_mx_hosts() -> None:
    policy = parse_policy(RFC_EXAMPLE, "i")
    assert policy_allows(policy, "mx7.example.net")
    assert not policy_allows(policy, "evil.example.com")


# -- the cache's plan ---------------------------------------------------------------------

POLICY = StsPolicy(id="one", mode=StsMode.ENFORCE, mx=("mx.example",), max_age=1000)
FRESH = CachedPolicy(POLICY, fetched_at=0.0)


@pytest.mark.parametrize(
    ("entry", "record_id", "now", "step"),
    [
        (None, None, 0.0, Step.NO_POLICY),
        (None, "one", 0.0, Step.FETCH),
        (FRESH, "one", 10.0, Step.USE),
        (FRESH, "one", 749.0, Step.USE),
        (FRESH, "one", 751.0, Step.REFRESH),  # under a quarter of max_age left
        (FRESH, "two", 10.0, Step.REFETCH),
        (FRESH, None, 10.0, Step.USE),  # no live record: the cache applies
        (FRESH, None, 1000.0, Step.NO_POLICY),  # ... until it expires
        (FRESH, "one", 1000.0, Step.FETCH),  # expired
    ],
)
def test_the_cache_plan(
    entry: CachedPolicy | None, record_id: str | None, now: float, step: Step
) -> None:
    assert plan(entry, record_id, now) is step


def test_a_failed_fetch_keeps_a_valid_policy_and_drops_an_expired_one() -> None:
    assert fallback(FRESH, 999.0) == POLICY
    assert fallback(FRESH, 1000.0) is None
    assert fallback(None, 0.0) is None


@given(
    st.none() | st.floats(min_value=0, max_value=1e6),
    st.sampled_from([None, "one", "two"]),
    st.floats(min_value=0, max_value=2e6),
)
def test_the_plan_never_uses_an_expired_policy(
    fetched: float | None, record: str | None, now: float
) -> None:
    entry = None if fetched is None else CachedPolicy(POLICY, fetched)
    step = plan(entry, record, now)
    if step is Step.USE:
        assert entry is not None
        assert entry.valid(now)
    if step in (Step.REFETCH, Step.REFRESH):
        assert fallback(entry, now) == POLICY
