"""The batched limiter (heartbeats): exact for one process, shared across
processes through Redis every flush interval, fail-open when Redis fails."""

from __future__ import annotations

import uuid

import anyio
import pytest
import redis.asyncio

from streamkit.connections import connect_redis
from streamkit.testing import RedisServer, RedisTarget, redis_client
from streamkit_server.auth.ratelimit import (
    FLUSH_INTERVAL_MS,
    SHARE_INTERVAL_MS,
    RateLimited,
    RateLimiter,
)
from streamkit_server.store.records import RedisClient

pytestmark = pytest.mark.redis


async def admitted(limiter: RateLimiter, ident: str, events: int, limit: int) -> int:
    count = 0
    for _ in range(events):
        try:
            await limiter.check_batched("hb", ident, window_ms=10_000, limit=limit)
        except RateLimited as exc:
            assert 1 <= exc.retry_after_s <= 10
            continue
        count += 1
    return count


async def test_one_process_admits_exactly_the_limit(redis_server: RedisServer) -> None:
    client: RedisClient = connect_redis(redis_server.url)
    try:
        limiter = RateLimiter(client, f"t-{uuid.uuid4().hex[:6]}")
        assert await admitted(limiter, "g", 25, limit=10) == 10
        assert await admitted(limiter, "other", 3, limit=10) == 3  # per ident
    finally:
        await client.aclose()


async def test_processes_share_their_counts(redis_server: RedisServer) -> None:
    client: RedisClient = connect_redis(redis_server.url)
    try:
        prefix = f"t-{uuid.uuid4().hex[:6]}"
        a, b = RateLimiter(client, prefix), RateLimiter(client, prefix)
        assert await admitted(a, "g", 6, limit=10) == 6
        await anyio.sleep(FLUSH_INTERVAL_MS / 1000 * 2)
        # B's first event flushes: it learns A's 6 (flushed by A's first event
        # after the interval, below) only once A has flushed them.
        assert await admitted(a, "g", 1, limit=10) == 1  # flushes A's 6: Redis 6
        assert await admitted(b, "g", 10, limit=10) == 4  # knows 6, admits 4
        # Over many rounds both processes together stay within the limit plus
        # what each admits between two of its flushes (here 3 per round).
        c, d = RateLimiter(client, prefix + "x"), RateLimiter(client, prefix + "x")
        total = 0
        for _round in range(10):
            total += await admitted(c, "g", 3, limit=20)
            total += await admitted(d, "g", 3, limit=20)
            await anyio.sleep(FLUSH_INTERVAL_MS / 1000 * 1.5)
        assert 20 <= total <= 20 + 2 * 3
    finally:
        await client.aclose()


async def test_one_flush_carries_every_counter(any_redis: RedisTarget) -> None:
    """A coordinator serving many groups shares all their counts in one round
    trip (a pipeline, split by node on a cluster), not one each."""
    client = redis_client(any_redis)
    try:
        prefix = f"t-{uuid.uuid4().hex[:6]}"
        a, b = RateLimiter(client, prefix), RateLimiter(client, prefix)
        groups = [f"g{i}" for i in range(20)]  # spread over the cluster's slots
        for group in groups:
            assert await admitted(a, group, 4, limit=10) == 4
        # A new group's first event flushes: it carries every counter due
        # (4 of 10 unshared is well past an eighth of what is left).
        assert await admitted(a, "late", 1, limit=10) == 1
        for group in groups:
            assert int(await client.get(f"{prefix}:ratelimit:hb:{group}") or 0) == 4
            assert 0 < await client.pttl(f"{prefix}:ratelimit:hb:{group}") <= 10_000
        # B's first event learns every count: 6 more per group, not 10.
        for group in groups:
            assert await admitted(b, group, 10, limit=10) == 6
    finally:
        await client.aclose()


async def test_counters_far_from_their_limit_are_shared_each_second(
    redis_server: RedisServer,
) -> None:
    client: RedisClient = connect_redis(redis_server.url)
    try:
        prefix = f"t-{uuid.uuid4().hex[:6]}"
        limiter = RateLimiter(client, prefix)
        key = f"{prefix}:ratelimit:hb:g"
        assert await admitted(limiter, "g", 50, limit=100_000) == 50
        assert await admitted(limiter, "quiet", 3, limit=100_000) == 3
        await anyio.sleep(FLUSH_INTERVAL_MS / 1000 * 2)
        assert await admitted(limiter, "g", 1, limit=100_000) == 1
        assert int(await client.get(key) or 0) == 0  # far from the limit: not yet
        await anyio.sleep(SHARE_INTERVAL_MS / 1000)
        assert await admitted(limiter, "g", 1, limit=100_000) == 1
        assert int(await client.get(key) or 0) == 51
        # The quiet group's events went with the same flush.
        assert int(await client.get(f"{prefix}:ratelimit:hb:quiet") or 0) == 3
    finally:
        await client.aclose()


async def test_overlapping_flushes_add_every_event_once(redis_server: RedisServer) -> None:
    """Many concurrent requests (a new window's first event flushes at once,
    beside a flush still out): at rest, Redis has exactly what was admitted."""
    client: RedisClient = connect_redis(redis_server.url)
    try:
        prefix = f"t-{uuid.uuid4().hex[:6]}"
        limiter = RateLimiter(client, prefix)
        groups = [f"g{i}" for i in range(45)]
        counts = dict.fromkeys([*groups, "last"], 0)
        limit = 210  # never reached; so close that busy groups are due often

        async def requests(worker: int) -> None:
            for step in range(40):
                # Five busy groups, and a new one every step: its first event
                # flushes while a flush of the busy ones may be out.
                group = groups[worker % 5] if worker % 2 else groups[5 + step]
                admitted_now = await admitted(limiter, group, 1, limit=limit)
                counts[group] += admitted_now  # read after the await: no lost update
                if step % 5 == 0:
                    await anyio.sleep(FLUSH_INTERVAL_MS / 1000 / 4)

        async with anyio.create_task_group() as tg:
            for worker in range(50):
                tg.start_soon(requests, worker)
        assert sum(counts.values()) == 50 * 40
        # At rest, once every counter is due, one new window's flush adds all.
        await anyio.sleep(SHARE_INTERVAL_MS / 1000 * 1.1)
        counts["last"] += await admitted(limiter, "last", 1, limit=limit)
        for group in groups:
            stored = int(await client.get(f"{prefix}:ratelimit:hb:{group}") or 0)
            share = limiter._shares[f"{prefix}:ratelimit:hb:{group}"]
            assert (share.sending, share.pending) == (0, 0)
            assert stored == counts[group], group
    finally:
        await client.aclose()


async def test_redis_failure_fails_open() -> None:
    # Nothing listens there: the limiter must not fail or stall requests.
    client: RedisClient = redis.asyncio.Redis(port=1, socket_connect_timeout=0.2)
    try:
        limiter = RateLimiter(client, "down")
        with anyio.fail_after(5):
            assert await admitted(limiter, "g", 3, limit=10) == 3
    finally:
        await client.aclose()
