"""Per-route request figures: the quantile estimate (property) and the endpoint (real HTTP)."""

from __future__ import annotations

import itertools
import math

import httpx
from coordinator_fixtures import CoordinatorPool
from hypothesis import given
from hypothesis import strategies as st

from streamkit.testing import RedisTarget
from streamkit_server.observability.metrics import _LATENCY_BUCKETS, bucket_quantile

from ..sim import API

BOUNDS = (*_LATENCY_BUCKETS, math.inf)


def _buckets(values: list[float]) -> list[tuple[float, float]]:
    return [(b, float(sum(v <= b for v in values))) for b in BOUNDS]


@given(
    st.lists(st.floats(min_value=0.0, max_value=10.0), min_size=1, max_size=200),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_the_estimate_lies_in_the_bucket_of_the_true_quantile(
    values: list[float], q: float
) -> None:
    estimate = bucket_quantile(q, _buckets(values))
    assert estimate is not None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(values)))
    true = ordered[rank - 1]
    upper = next(b for b in BOUNDS if true <= b)
    lower = max([0.0, *(b for b in BOUNDS if b < upper)])
    if math.isinf(upper):  # beyond the last finite bound: that bound is all it can say
        assert estimate == _LATENCY_BUCKETS[-1]
    else:
        assert lower <= estimate <= upper


@given(st.lists(st.floats(min_value=0.0, max_value=10.0), min_size=1, max_size=100))
def test_the_estimate_grows_with_q(values: list[float]) -> None:
    buckets = _buckets(values)
    estimates = [bucket_quantile(q / 20, buckets) for q in range(21)]
    assert all(a is not None and b is not None and a <= b
               for a, b in itertools.pairwise(estimates))  # fmt: skip


def test_no_observation_no_estimate() -> None:
    assert bucket_quantile(0.5, [(b, 0.0) for b in BOUNDS]) is None
    assert bucket_quantile(0.5, []) is None


def _figures(http: httpx.Client) -> dict[tuple[str, str], dict[str, object]]:
    answer = http.get(f"{API}/monitoring/api-performance")
    assert answer.status_code == 200, answer.text
    return {(r["route"], r["method"]): r for r in answer.json()["routes"]}


def test_requests_are_counted_per_route(redis_url: str, coordinator_pool: CoordinatorPool) -> None:
    coordinator = coordinator_pool.get(RedisTarget(url=redis_url, cluster=False))
    with httpx.Client(base_url=coordinator.url, auth=coordinator.admin_auth, timeout=10) as http:
        before = _figures(http)
        for _ in range(5):
            assert http.get(f"{API}/monitoring/health").status_code == 200
        missing = http.get(f"{API}/monitoring/streams/nope/groups/none")
        assert missing.status_code == 404
        # A path no route serves is counted, but not under a label it chose.
        assert http.get("/no/such/path/a1b2c3").status_code == 404
        after = _figures(http)
    health = after[("getCoordinatorHealth", "GET")]
    was = before.get(("getCoordinatorHealth", "GET"), {"count": 0})
    assert health["count"] == int(was["count"]) + 5  # type: ignore[call-overload]
    assert health["clientErrors"] == 0 and health["serverErrors"] == 0
    assert 0 < health["p50Ms"] <= health["p99Ms"]  # type: ignore[operator]
    assert health["meanMs"] > 0  # type: ignore[operator]
    assert after[("getMonitoringGroup", "GET")]["clientErrors"] == 1
    assert after[("unmatched", "GET")]["clientErrors"] >= 1
    assert not any("a1b2c3" in route for route, _ in after)
