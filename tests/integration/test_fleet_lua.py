"""The shared state's Lua against the Python model, on a real redis-server.

``runtime.fleet.scripts`` mirrors ``policy.fleetshare`` (the max-min allocation between
the fleet's tenants, a gateway's leases) and ``policy.learned`` (the learned limit); the
scripts decide atomically in Redis, the Python is the definition. Hypothesis draws the
inputs; the Lua must give the same answer for every one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis
from tests.support.redis_server import RedisServer, redis_server  # noqa: F401 (fixture)

from mailsluice.policy.fleetshare import Demand, allocate, lease
from mailsluice.policy.learned import LearnedLimit, LimitRules
from mailsluice.runtime.fleet.scripts import ALLOCATE_TEST, LEARN_TEST


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[Redis]:  # noqa: F811
    with Redis(host=redis_server.host, port=redis_server.port, decode_responses=True) as c:
        yield c


names = st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3", "bulk", "vip", "a", "b"])
weights = st.sampled_from([1.0, 2.0, 0.5, 3.0])
demand = st.builds(
    Demand,
    held=st.integers(0, 5),
    waiting=st.integers(0, 5),
    weight=weights,
    served=st.integers(0, 24).map(lambda n: n / 2),  # small: ties and the quantum matter
)
tenants = st.dictionaries(names, demand, max_size=6)
leases = st.lists(st.tuples(*(st.integers(0, 25) for _ in range(5))), max_size=5)

SLOW = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SLOW
@given(limit=st.integers(0, 14), tenants=tenants, quantum=st.sampled_from([0.0, 4.0]),
       rows=leases)  # fmt: skip
def test_allocation_and_leases_match_the_model(
    client: Redis,
    limit: int,
    tenants: dict[str, Demand],
    quantum: float,
    rows: list[tuple[int, ...]],
) -> None:
    request = {
        "limit": limit, "quantum": quantum,
        "tenants": [[n, d.held, d.waiting, d.weight, d.served] for n, d in tenants.items()],
        "leases": [list(r) for r in rows],
    }  # fmt: skip
    answer = json.loads(str(client.eval(ALLOCATE_TEST, 0, json.dumps(request))))
    expected = allocate(limit, tenants, quantum)
    assert dict(answer["given"] or []) == expected
    assert sum(expected.values()) <= limit
    want = [lease(limit=a, target=b, others=c, in_use=d, bound=e) for a, b, c, d, e in rows]
    assert (answer["leases"] or []) == want


steps = st.lists(
    st.tuples(
        st.sampled_from(["r", "a", "a", "a", "a"]), st.integers(2, 6), st.integers(0, 200_000)
    ),
    max_size=60,
)


@SLOW
@given(start=st.integers(2, 6), fixed=st.sampled_from([0, 3, 7]), steps=steps)
def test_learned_limit_matches_the_model(
    client: Redis, start: int, fixed: int, steps: list[tuple[str, int, int]]
) -> None:
    rules = LimitRules(start=start, floor=1, ceiling=20, quiet=60.0)
    ordered = sorted(steps, key=lambda s: s[2])  # time goes forward
    model = LearnedLimit(rules, fixed=fixed or None)
    want: list[int] = []
    for kind, number, ms in ordered:
        if kind == "r":
            want.append(model.refused(number, ms / 1000))
        else:
            want.append(model.accepted(number, ms / 1000))
    request = {
        "limit": model_start(rules, fixed), "floor": 1, "ceiling": 20, "quiet": 60_000,
        "fixed": fixed, "steps": [list(s) for s in ordered],
    }  # fmt: skip
    answer = json.loads(str(client.eval(LEARN_TEST, 0, json.dumps(request))))
    got = [fixed or value for value in (answer or [])]
    assert got == want


def model_start(rules: LimitRules, fixed: int) -> int:
    return fixed or LearnedLimit(rules).value
