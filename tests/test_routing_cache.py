"""Tests for the producer routing cache rules (SPEC §4, seed 000)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from streamkit.errors import StreamkitError
from streamkit.publisher.routing_cache import Route, RoutingCache, RoutingTable, RoutingUnavailable
from streamkit.routing import shard_for_key

REFRESH = 10.0
LEASE = 30.0
T0 = 1000.0  # the fake monotonic clock starts somewhere arbitrary


def table(version: int, shard_count: int = 4, fetched_at: float = T0) -> RoutingTable:
    return RoutingTable(
        metadata_version=version,
        shard_count=shard_count,
        stream_key_pattern="orders:{shardIndex}",
        shard_keys=tuple(f"orders:{i}" for i in range(shard_count)),
        fetched_at=fetched_at,
    )


def wire(version: int = 3, shard_count: int = 3, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "streamPrefix": "orders",
        "consumerGroup": "billing",
        "metadataVersion": version,
        "shardCount": shard_count,
        "streamKeyPattern": "orders:{shardIndex}",
        "shards": [
            {"shardIndex": i, "streamKey": f"orders:{i}", "redisSlot": 0}
            for i in range(shard_count)
        ],
    }
    body.update(overrides)
    return body


def cache_with(version: int = 5, at: float = T0, shard_count: int = 4) -> RoutingCache:
    cache = RoutingCache(refresh_interval=REFRESH, lease=LEASE, name="orders/billing")
    assert cache.apply(table(version, shard_count, fetched_at=at), at)
    return cache


# --- construction -----------------------------------------------------------


@pytest.mark.parametrize(
    ("refresh", "lease"), [(10.0, 10.0), (10.0, 5.0), (0.0, 5.0), (-1.0, 5.0), (1.0, float("inf"))]
)
def test_lease_must_exceed_refresh_interval(refresh: float, lease: float) -> None:
    with pytest.raises(ValueError):
        RoutingCache(refresh_interval=refresh, lease=lease)


def test_routing_unavailable_is_a_streamkit_error() -> None:
    assert issubclass(RoutingUnavailable, StreamkitError)


# --- refresh timing ---------------------------------------------------------


def test_empty_cache_needs_refresh_and_cannot_route() -> None:
    cache = RoutingCache(refresh_interval=REFRESH, lease=LEASE)
    assert cache.needs_refresh(T0)
    assert cache.refresh_deadline(T0) == 0.0
    assert cache.age(T0) is None
    with pytest.raises(RoutingUnavailable) as err:
        cache.route("k", T0)
    assert err.value.reason == "no_table"


def test_refresh_is_due_before_the_lease_expires() -> None:
    cache = cache_with(at=T0)
    assert not cache.needs_refresh(T0 + REFRESH - 0.001)
    assert cache.refresh_deadline(T0 + 4) == pytest.approx(REFRESH - 4)
    assert cache.needs_refresh(T0 + REFRESH)
    assert cache.refresh_deadline(T0 + REFRESH) == 0.0
    # Refresh is due while routing still works: there is time to retry.
    assert cache.route("k", T0 + REFRESH).metadata_version == 5
    assert cache.age(T0 + REFRESH) == pytest.approx(REFRESH)


def test_route_uses_the_spec_hash_and_the_table_keys() -> None:
    cache = cache_with(version=9, shard_count=100)
    assert cache.route("order-123", T0) == Route("orders:41", 41, 9)
    assert cache.route(b"a", T0).shard_index == shard_for_key("a", 100) == 50


# --- failures and the lease -------------------------------------------------


def test_failed_refresh_keeps_the_cache_inside_the_lease() -> None:
    cache = cache_with(at=T0)
    error = ConnectionError("coordinator down")
    cache.refresh_failed(T0 + REFRESH, error)
    cache.refresh_failed(T0 + REFRESH + 5, error)
    assert cache.table is not None and cache.table.metadata_version == 5
    assert cache.route("k", T0 + LEASE - 0.001).metadata_version == 5
    assert (cache.consecutive_failures, cache.total_failures) == (2, 2)
    assert cache.last_error is error


def test_fail_closed_after_the_lease_when_refresh_failed() -> None:
    cache = cache_with(at=T0)
    cache.refresh_failed(T0 + REFRESH, "timeout")
    with pytest.raises(RoutingUnavailable) as err:
        cache.route("k", T0 + LEASE)
    assert err.value.reason == "lease_expired"
    assert "timeout" in str(err.value)
    assert "orders/billing" in str(err.value)


def test_successful_refresh_after_expiry_restores_routing() -> None:
    cache = cache_with(version=5, at=T0)
    cache.refresh_failed(T0 + REFRESH, "timeout")
    later = T0 + LEASE + 100
    cache.apply(table(5, fetched_at=later), later)
    assert cache.route("k", later).metadata_version == 5
    assert cache.consecutive_failures == 0
    assert cache.total_failures == 1  # monotonic, for a counter metric


def test_retry_after_failure_waits_retry_interval() -> None:
    cache = RoutingCache(refresh_interval=REFRESH, lease=LEASE, retry_interval=2.0)
    cache.refresh_failed(T0, "boom")
    # A background loop must not spin against a coordinator that is down.
    assert cache.refresh_deadline(T0 + 0.5) == pytest.approx(1.5)
    assert cache.refresh_deadline(T0 + 2.0) == 0.0


def test_default_retry_interval_fits_several_retries_in_the_lease() -> None:
    cache = RoutingCache(refresh_interval=REFRESH, lease=LEASE)
    assert cache.retry_interval * 3 <= LEASE - REFRESH


# --- versions ---------------------------------------------------------------


def test_replace_only_with_a_newer_version() -> None:
    cache = cache_with(version=5, at=T0)
    assert not cache.apply(table(4, shard_count=8, fetched_at=T0 + 1), T0 + 1)
    assert cache.table is not None
    assert (cache.table.metadata_version, cache.table.shard_count) == (5, 4)
    assert cache.older_responses == 1
    assert cache.apply(table(6, shard_count=8, fetched_at=T0 + 2), T0 + 2)
    assert cache.route("k", T0 + 2).metadata_version == 6
    assert cache.table.shard_count == 8


def test_older_version_does_not_renew_the_lease() -> None:
    cache = cache_with(version=5, at=T0)
    cache.apply(table(4, fetched_at=T0 + 20), T0 + 20)
    with pytest.raises(RoutingUnavailable):
        cache.route("k", T0 + LEASE)


def test_equal_version_renews_the_lease() -> None:
    cache = cache_with(version=5, at=T0)
    assert not cache.apply(table(5, fetched_at=T0 + 20), T0 + 20)  # not replaced...
    assert cache.table is not None and cache.table.fetched_at == T0 + 20  # ...but renewed
    assert not cache.needs_refresh(T0 + 20 + REFRESH - 1)
    assert cache.route("k", T0 + 20 + LEASE - 1).metadata_version == 5
    with pytest.raises(RoutingUnavailable):
        cache.route("k", T0 + 20 + LEASE)


def test_delayed_equal_version_does_not_move_the_lease_back() -> None:
    cache = cache_with(version=5, at=T0 + 20)
    cache.apply(table(5, fetched_at=T0), T0 + 25)
    assert cache.table is not None and cache.table.fetched_at == T0 + 20


def test_lease_is_anchored_no_later_than_the_callers_clock() -> None:
    cache = RoutingCache(refresh_interval=REFRESH, lease=LEASE)
    cache.apply(table(1, fetched_at=T0 + 50), T0)  # a table claiming to be from the future
    assert cache.table is not None and cache.table.fetched_at == T0


def test_highest_seen_version_is_remembered() -> None:
    cache = RoutingCache(refresh_interval=REFRESH, lease=LEASE)
    assert cache.highest_seen_version == 0
    cache.apply(table(9), T0)
    cache.apply(table(3), T0 + 1)  # rejected (Redis lost writes?) but still seen
    assert cache.highest_seen_version == 9
    assert cache.table is not None and cache.table.metadata_version == 9


# --- stale routes -----------------------------------------------------------


def test_mark_stale_forces_a_refresh() -> None:
    cache = cache_with(version=5, at=T0)
    assert not cache.needs_refresh(T0 + 1)
    cache.mark_stale(T0 + 1)
    assert cache.needs_refresh(T0 + 1)
    assert cache.refresh_deadline(T0 + 1) == 0.0
    assert (cache.stale, cache.stale_since, cache.stale_marks) == (True, T0 + 1, 1)
    # Documented choice: the table still routes inside its lease meanwhile.
    assert cache.route("k", T0 + 2).metadata_version == 5
    cache.apply(table(6, fetched_at=T0 + 2), T0 + 2)
    assert not cache.needs_refresh(T0 + 2)
    assert cache.stale_since is None


def test_equal_version_answer_clears_stale() -> None:
    # Otherwise a key the coordinator still routes would force a refresh on
    # every call; the caller's publish retry surfaces the error instead.
    cache = cache_with(version=5, at=T0)
    cache.mark_stale(T0 + 1)
    cache.apply(table(5, fetched_at=T0 + 2), T0 + 2)
    assert not cache.needs_refresh(T0 + 2)


def test_older_answer_keeps_stale() -> None:
    cache = cache_with(version=5, at=T0)
    cache.mark_stale(T0 + 1)
    cache.apply(table(4, fetched_at=T0 + 2), T0 + 2)
    assert cache.needs_refresh(T0 + 2)


def test_stale_table_stops_routing_at_lease_end() -> None:
    cache = cache_with(version=5, at=T0)
    cache.mark_stale(T0 + 1)
    with pytest.raises(RoutingUnavailable):
        cache.route("k", T0 + LEASE)


# --- scaled to zero ---------------------------------------------------------


def test_zero_shards_fails_closed() -> None:
    cache = cache_with(version=7, shard_count=0)
    with pytest.raises(RoutingUnavailable, match="drained or scaled to zero") as err:
        cache.route("k", T0)
    assert err.value.reason == "no_shards"
    assert not cache.needs_refresh(T0)  # the table itself is valid and current


# --- wire parsing -----------------------------------------------------------


def test_from_wire() -> None:
    body = wire(version=12, shard_count=3)
    body["shards"].reverse()  # order on the wire does not matter
    parsed = RoutingTable.from_wire(body, T0)
    assert parsed == RoutingTable(
        12, 3, "orders:{shardIndex}", ("orders:0", "orders:1", "orders:2"), T0
    )


def test_from_wire_zero_shards() -> None:
    assert RoutingTable.from_wire(wire(shard_count=0), T0).shard_keys == ()


@pytest.mark.parametrize(
    "body",
    [
        wire(shards=[{"shardIndex": 0, "streamKey": "a"}, {"shardIndex": 1, "streamKey": "b"}]),
        wire(
            shards=[
                {"shardIndex": 0, "streamKey": "a"},
                {"shardIndex": 1, "streamKey": "b"},
                {"shardIndex": 1, "streamKey": "c"},
            ]
        ),
        wire(
            shards=[
                {"shardIndex": 0, "streamKey": "a"},
                {"shardIndex": 1, "streamKey": "b"},
                {"shardIndex": 3, "streamKey": "c"},
            ]
        ),
        wire(shardCount=-1, shards=[]),
        wire(metadataVersion=True),
        wire(metadataVersion="3"),
        wire(streamKeyPattern=None),
        wire(shards=None),
        wire(shards=[1, 2, 3]),
        {"metadataVersion": 1, "shardCount": 0, "streamKeyPattern": "x:{shardIndex}"},
    ],
    ids=[
        "gap",
        "duplicate",
        "out-of-range",
        "negative-count",
        "bool-version",
        "str-version",
        "no-pattern",
        "null-shards",
        "non-object-shard",
        "missing-shards",
    ],
)
def test_from_wire_rejects_malformed_bodies(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RoutingTable.from_wire(body, T0)


# --- model-based ------------------------------------------------------------


class RoutingCacheMachine(RuleBasedStateMachine):
    """Random sequences of refresh results, failures, stale marks and time."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.cache = RoutingCache(refresh_interval=REFRESH, lease=LEASE)
        self.version: int | None = None  # the version the model says is current
        self.last_success: float | None = None  # when the last accepted apply ran
        self.anchor: float | None = None  # when the model's lease began
        self.shard_count = 0
        self.max_seen = 0
        self.observed_version = -1  # the cache's version at the last check

    @rule(dt=st.floats(0, 2 * LEASE, allow_nan=False))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(
        version=st.integers(0, 6),
        shard_count=st.integers(0, 4),
        delay=st.floats(0, 5, allow_nan=False),
    )
    def apply(self, version: int, shard_count: int, delay: float) -> None:
        fetched = self.now - delay  # answer to a request sent `delay` ago
        replaced = self.cache.apply(table(version, shard_count, fetched_at=fetched), self.now)
        self.max_seen = max(self.max_seen, version)
        if self.version is None or version > self.version:
            assert replaced
            self.version, self.shard_count, self.anchor = version, shard_count, fetched
            self.last_success = self.now
        elif version == self.version:
            assert not replaced
            assert self.anchor is not None
            self.anchor = max(self.anchor, fetched)
            self.last_success = self.now
        else:
            assert not replaced

    @rule()
    def refresh_failed(self) -> None:
        self.cache.refresh_failed(self.now, "boom")

    @rule()
    def mark_stale(self) -> None:
        self.cache.mark_stale(self.now)
        assert self.cache.needs_refresh(self.now)

    @rule(key=st.text(max_size=12))
    def route(self, key: str) -> None:
        lease_ok = self.anchor is not None and self.now < self.anchor + LEASE
        try:
            route = self.cache.route(key, self.now)
        except RoutingUnavailable:
            # Fail closed only for a reason: no table, lease over, or no shards.
            assert not lease_ok or self.shard_count == 0
            return
        # Never routes after lease expiry without a successful apply.
        assert self.last_success is not None and self.now < self.last_success + LEASE
        assert lease_ok and self.shard_count > 0
        assert route.metadata_version == self.version
        assert route.shard_index == shard_for_key(key, self.shard_count)
        assert route.stream_key == f"orders:{route.shard_index}"

    @precondition(lambda self: self.version is not None)
    @invariant()
    def version_never_decreases(self) -> None:
        current = self.cache.table
        assert current is not None and current.metadata_version == self.version
        assert current.metadata_version >= self.observed_version
        self.observed_version = current.metadata_version

    @invariant()
    def highest_seen_is_the_max(self) -> None:
        assert self.cache.highest_seen_version == self.max_seen


# too_slow: a pure machine, but CI shares two cores with real servers.
RoutingCacheMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, suppress_health_check=[HealthCheck.too_slow]
)
test_routing_cache_machine = RoutingCacheMachine.TestCase
