"""SPEC §4 / seed 000 cache rules, one by one, against a coordinator this test
stops, freezes (SIGSTOP) and restarts, with a clock the test moves.

Timings: refresh interval 5 s, lease 30 s, so the retry interval and the
"lease about to end" margin are 5 s: from age 5 a publish schedules a refresh,
from age 25 it waits for one, from age 30 without a refresh it fails closed.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from streamkit.publisher.routing_cache import RoutingUnavailable
from streamkit.routing import shard_for_key

from .conftest import Stack, eventually, gather


@contextmanager
def frozen(stack: Stack) -> Iterator[None]:
    """The coordinator accepts connections but answers nothing (a hung process)."""
    stack.coordinator.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        stack.coordinator.signal(signal.SIGCONT)


async def test_failed_refresh_inside_the_lease_keeps_the_cache(private_stack: Stack) -> None:
    s = private_stack
    pub = await s.started_publisher(4)
    cache = pub.routing_cache
    assert pub.refresher.started == 1
    s.coordinator.stop()

    s.clock.advance(6)  # refresh due: scheduled, the publish does not wait for it
    assert (await pub.publish("k", {"a": 1})).metadata_version == 1
    await eventually(lambda: cache.total_failures == 1)
    assert pub.refresher.started == 2
    await pub.publish("k", {"a": 2})  # backing off: no new request yet
    assert pub.refresher.started == 2

    s.clock.advance(19)  # age 25: the lease is about to end, the publish waits ...
    assert (await pub.publish("k", {"a": 3})).metadata_version == 1  # ... and still goes out
    assert pub.refresher.started == 3 and cache.total_failures == 2
    s.clock.advance(4.9)  # age 29.9, last failure 4.9 s ago: no request, still valid
    await pub.publish("k", {"a": 4})
    assert pub.refresher.started == 3
    assert pub.published == 4 and pub.routing_failures == 0


async def test_fails_closed_once_the_lease_expired_and_recovers(private_stack: Stack) -> None:
    s = private_stack
    pub = await s.started_publisher(4)
    s.coordinator.stop()

    s.clock.advance(30)
    with pytest.raises(RoutingUnavailable) as caught:
        await pub.publish("k", {"a": 1})
    assert caught.value.reason == "lease_expired"
    assert "ConnectError" in str(caught.value) or "connect" in str(caught.value).lower()
    assert pub.refresher.started == 2  # it did try to refresh first
    with pytest.raises(RoutingUnavailable):
        await pub.publish("k", {"a": 1})  # backing off: fails at once, no request
    assert pub.refresher.started == 2 and pub.routing_failures == 2
    assert pub.published == 0
    assert all([await s.redis.xlen(s.key(i)) == 0 for i in range(4)])

    s.coordinator.restart()
    s.clock.advance(5)  # one retry interval later the publish refreshes first
    assert (await pub.publish("k", {"a": 1})).metadata_version == 1
    assert pub.refresher.started == 3
    assert pub.routing_cache.age(s.clock()) == 0


async def test_only_a_newer_version_replaces_the_table(private_stack: Stack) -> None:
    s = private_stack
    pub = await s.started_publisher(4)
    old = await s.metadata_snapshot()  # version 1

    assert await s.rewrite_routing() == 2
    s.clock.advance(6)
    await pub.publish("k", {"a": 1})  # schedules the refresh
    await eventually(lambda: pub.refresher.refreshes == 2)
    assert (await pub.publish("k", {"a": 2})).metadata_version == 2
    refreshed_at = s.clock()

    await s.restore_metadata(old)  # Redis lost the write: the coordinator says 1 again
    s.clock.advance(6)
    await pub.publish("k", {"a": 3})
    await eventually(lambda: pub.refresher.refreshes == 3)
    cache = pub.routing_cache
    assert cache.older_responses == 1 and cache.highest_seen_version == 2
    assert (await pub.publish("k", {"a": 4})).metadata_version == 2

    # An older answer is not a confirmation: it does not renew the lease.
    s.clock.now = refreshed_at + 30
    with pytest.raises(RoutingUnavailable) as caught:
        await pub.publish("k", {"a": 5})
    assert caught.value.reason == "lease_expired"
    assert cache.older_responses == 2


async def test_periodic_refresh_picks_up_a_reshard(private_stack: Stack) -> None:
    s = private_stack
    pub = await s.started_publisher(4)
    await s.rewrite_routing(shard_count=8)
    keys = [f"user-{i}" for i in range(50)]
    moved = next(k for k in keys if shard_for_key(k, 4) != shard_for_key(k, 8))

    # Inside the refresh interval the producer keeps the routing it has ...
    s.clock.advance(4)
    assert (await pub.publish(moved, {"a": 1})).shard_index == shard_for_key(moved, 4)
    assert pub.refresher.started == 1
    # ... then the first publish past it schedules a refresh.
    s.clock.advance(2)
    await pub.publish(moved, {"a": 2})
    await eventually(lambda: pub.metadata_version == 2)
    result = await pub.publish(moved, {"a": 3})
    assert (result.shard_index, result.metadata_version) == (shard_for_key(moved, 8), 2)


async def test_a_newer_version_seen_elsewhere_refreshes_at_once(private_stack: Stack) -> None:
    s = private_stack
    pub = await s.started_publisher(4)
    pub.note_metadata_version(1)  # not newer: nothing to do
    await pub.publish("k", {"a": 1})
    assert pub.refresher.started == 1

    await s.rewrite_routing(shard_count=8)
    pub.note_metadata_version(2)  # e.g. a consumer of the group saw version 2
    result = await pub.publish("user-7", {"a": 2})  # no clock movement needed
    assert result.metadata_version == 2 and result.shard_index == shard_for_key("user-7", 8)
    assert pub.refresher.started == 2 and pub.stale_refreshes == 1


async def test_zero_shards_fail_closed(private_stack: Stack) -> None:
    s = private_stack
    pub = await s.started_publisher(2)
    await s.rewrite_routing(shard_count=0)
    s.clock.advance(6)
    await pub.publish("k", {"a": 1})  # old routing, refresh scheduled
    await eventually(lambda: pub.metadata_version == 2)
    with pytest.raises(RoutingUnavailable) as caught:
        await pub.publish("k", {"a": 2})
    assert caught.value.reason == "no_shards"
    with pytest.raises(RoutingUnavailable):
        await pub.publish_many([("k", {"a": 3})])
    assert pub.routing_failures == 2


async def test_scheduled_refresh_never_blocks_a_publish(private_stack: Stack) -> None:
    s = private_stack
    pub = await s.started_publisher(4, settings=s.settings(coordinator_timeout=3.0))
    with frozen(s):
        s.clock.advance(6)
        started = time.monotonic()
        for i in range(20):
            await pub.publish(f"k{i}", {"a": i})
        assert time.monotonic() - started < 1.0
        assert pub.refresher.in_flight and pub.refresher.started == 2
    await eventually(lambda: not pub.refresher.in_flight)
    assert pub.refresher.refreshes == 2  # the frozen request was answered after SIGCONT


async def test_near_the_lease_end_publishes_wait_for_one_shared_refresh(
    private_stack: Stack,
) -> None:
    s = private_stack
    pub = await s.started_publisher(4, settings=s.settings(coordinator_timeout=0.5))
    with frozen(s):
        s.clock.advance(26)
        started = time.monotonic()
        results = await gather(*[lambda i=i: pub.publish(f"k{i}", {"a": i}) for i in range(100)])
        waited = time.monotonic() - started
    # All waited for the one request (it timed out), then used the still-valid table.
    assert all(r.metadata_version == 1 for r in results)
    assert 0.4 < waited < 2.0
    assert pub.refresher.started == 2 and pub.routing_cache.total_failures == 1


async def test_aclose_cancels_the_refresh_in_flight(private_stack: Stack) -> None:
    s = private_stack
    pub = await s.started_publisher(4, settings=s.settings(coordinator_timeout=10.0))
    with frozen(s):
        s.clock.advance(6)
        await pub.publish("k", {"a": 1})
        assert pub.refresher.in_flight
        started = time.monotonic()
        await pub.aclose()
        assert time.monotonic() - started < 1.0
        assert not pub.refresher.in_flight
        leftovers = [t for t in asyncio.all_tasks() if "routing refresh" in t.get_name()]
        assert leftovers == []
