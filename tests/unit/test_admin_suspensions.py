"""The operator's suspensions (``runtime.suspensions``), the admin router's path patterns
and public routes, and the pure parts of ``mailsluice ctl``/``top``."""

from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mailsluice.cli.ctl import CtlError, Sample, parse_duration, render_frame
from mailsluice.runtime.admin.http import Request, Response, Router
from mailsluice.runtime.admin.live import valid_session_id
from mailsluice.runtime.suspensions import (
    SuspensionError,
    Suspensions,
    destination_matches,
)

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_suspension_names_who_until_when_and_why() -> None:
    clock = Clock(1_700_000_000.0)  # 22:13:20 UTC
    made = Suspensions(None, clock).add("tenant", "shop", 1800, "flood")
    assert made.text() == "tenant shop suspended by the operator until 22:43:20 UTC: flood"
    assert Suspensions(None, clock).add("tenant", "x", 60, "").text().endswith("22:14:20 UTC")


@pytest.mark.parametrize(
    ("kind", "name", "seconds", "reason", "says"),
    [
        ("planet", "x", 60, "", "kind: one of tenant, destination, source"),
        ("tenant", "", 60, "", "name: a non-empty string"),
        ("tenant", "a\r\nb", 60, "", "printable"),
        ("tenant", "a", 0, "", "seconds: more than 0"),
        ("tenant", "a", 31 * 86400, "", "at most 2592000"),
        ("tenant", "a", True, "", "a number of seconds"),
        ("tenant", "a", "60", "", "a number of seconds"),
        ("tenant", "a", 60, "x" * 201, "reason: at most 200"),
    ],
)
def test_a_bad_request_is_refused_with_what_is_wrong(
    kind: object, name: object, seconds: object, reason: object, says: str
) -> None:
    with pytest.raises(SuspensionError, match=re.escape(says)):
        Suspensions(None).add(kind, name, seconds, reason)


@pytest.mark.parametrize(
    ("name", "host", "port", "matches"),
    [
        ("192.0.2.7", "192.0.2.7", 25, True),
        ("192.0.2.7", "::ffff:192.0.2.7", 25, True),
        ("192.0.2.7:25", "192.0.2.7", 25, True),
        ("192.0.2.7:587", "192.0.2.7", 25, False),
        ("192.0.2.8", "192.0.2.7", 25, False),
        ("2001:db8::1", "2001:db8::1", 25, True),
        ("[2001:db8::1]:25", "2001:db8::1", 25, True),
        ("[2001:db8::1]:26", "2001:db8::1", 25, False),
    ],
)
def test_a_destination_is_named_by_address_and_maybe_port(
    name: str, host: str, port: int, matches: bool
) -> None:
    assert destination_matches(name, host, port) is matches


# ------------------------------------------------------------------ the router
async def _echo(request: Request) -> Response:
    return Response.text(200, f"{request.method} {dict(request.params)}")


def _request(method: str, path: str) -> Request:
    return Request(method, path, "", {})


def test_path_patterns_and_public_routes() -> None:
    router = Router()
    router.add("GET", "/", _echo, public=True)
    router.add("POST", "/api/sessions/{id}/abort", _echo)
    router.add("DELETE", "/api/suspensions/{id}", _echo)

    def answer(method: str, path: str) -> tuple[int, str]:
        response = asyncio.run(router.dispatch(_request(method, path)))
        return response.status, response.body.decode()

    assert answer("POST", "/api/sessions/ab-1/abort") == (200, "POST {'id': 'ab-1'}")
    assert answer("DELETE", "/api/suspensions/42") == (200, "DELETE {'id': '42'}")
    assert answer("GET", "/api/sessions/ab-1/abort")[0] == 405
    assert answer("POST", "/api/sessions//abort")[0] == 404  # an empty segment is no id
    assert answer("POST", "/api/sessions/ab-1/abort/x")[0] == 404
    assert router.is_public(_request("GET", "/"))
    assert router.is_public(_request("HEAD", "/"))
    assert not router.is_public(_request("POST", "/api/sessions/ab-1/abort"))
    assert router.routes() == [
        ("DELETE", "/api/suspensions/{id}"), ("GET", "/"), ("POST", "/api/sessions/{id}/abort"),
    ]  # fmt: skip


@given(st.text(max_size=30))
def test_only_session_ids_pass(text: str) -> None:
    if valid_session_id(text):
        head, _, tail = text.partition("-")
        assert head
        assert set(head) <= set("0123456789abcdef")
        assert tail.isdigit()
        assert tail.isascii()


# ------------------------------------------------------------------ ctl / top
@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1d12h", 129600), ("1h30m", 5400)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "0", "0m", "30x", "m"])
def test_a_bad_duration_says_what_is_wanted(text: str) -> None:
    with pytest.raises(CtlError, match=r"a duration such as 90s|more than 0"):
        parse_duration(text)


def test_a_frame_of_top() -> None:
    overview = {
        "now": 1_700_000_010.0, "workers": 2, "fair_sharing": True, "uptime_s": 60,
        "delivered": 30, "deferred": 1, "mx_deferrals": {"rate": 2}, "suspensions": 1,
    }  # fmt: skip
    sessions = [{
        "id": "ab-000001", "client": "10.0.0.2:4000", "tenant": "shop",
        "destination": "192.0.2.7:25", "phase": "data", "age_s": 3.4, "bytes": 55,
    }]  # fmt: skip
    destinations = [{"destination": "192.0.2.7:25", "in_use": 1, "limit": 5, "learned": True,
                     "waiting": 2, "deferrals_15m": {"rate": 2}}]  # fmt: skip
    tenants = [{"tenant": "shop", "weight": 2.0, "sessions": 1, "busy": 1, "waiting": 2,
                "suspended": {"until": 1_700_001_000.0}}]  # fmt: skip
    frame = render_frame("127.0.0.1:9325", overview, sessions, destinations, tenants,
                         Sample(1_700_000_000.0, 10, 0))  # fmt: skip
    lines = frame.splitlines()
    assert lines[0].startswith("mailsluice top  127.0.0.1:9325  22:13:30 UTC  (2 worker(s)")
    assert lines[1] == (
        "sessions in flight 1   msg/s 2.0   delivered 30   deferrals 3   suspensions 1"
    )
    assert re.search(r"^192\.0\.2\.7:25\s+1\s+5\*\s+2\s+2$", frame, re.M)
    assert re.search(r"^shop\s+2\.0\s+1\s+1\s+2\s+until 22:30:00 UTC$", frame, re.M)
    assert re.search(r"^ab-000001\s+10\.0\.0\.2:4000\s+shop\s+192\.0\.2\.7:25\s+data\s+3s\s+55$",
                     frame, re.M)  # fmt: skip
    coloured = render_frame("x", overview, sessions, destinations, tenants, None, color=True)
    plain = re.sub(r"\x1b\[\d+m", "", coloured)
    assert plain.replace("msg/s -", "msg/s 2.0").splitlines()[2:] == lines[2:]
