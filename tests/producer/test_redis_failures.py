"""Bounded retries when Redis is unreachable or slow (at-least-once)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from streamkit.routing import shard_for_key
from streamkit.testing import RedisServer, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from .conftest import Stack


def _client(server: RedisServer, **options: object) -> redis.asyncio.Redis:
    # No redis-py retries, so the publisher's own retries are what we observe.
    return redis.asyncio.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0), **options)


@pytest.fixture
async def failing_stack(
    private_redis_server: RedisServer, coordinator_factory: Callable[..., CoordinatorProcess]
) -> Stack:
    target = RedisTarget(private_redis_server.url, cluster=False)
    stack = Stack(target, coordinator_factory(target), _client(private_redis_server))
    await stack.create_group(2)
    return stack


async def test_redis_down_fails_after_bounded_retries(
    failing_stack: Stack, private_redis_server: RedisServer
) -> None:
    s = failing_stack
    client = _client(private_redis_server)
    try:
        pub = s.publisher(redis=client)
        pub.retry_backoff = 0.01
        await pub.start()
        private_redis_server.kill()
        with pytest.raises(redis.exceptions.ConnectionError):
            await pub.publish("k", {"a": 1})
        assert pub.retries == pub.max_attempts - 1 == 2
        with pytest.raises(redis.exceptions.ConnectionError):
            await pub.publish_many([("a", {"a": 1}), ("b", {"b": 2})])
        assert pub.retries == 2 + 2 * 2  # two more attempts for both messages

        # Redis is back (empty: no persistence); the operator re-provisions the
        # shards and publishing resumes on fresh connections, same routing.
        private_redis_server.restart()
        for shard in range(2):
            await s.redis.xgroup_create(s.key(shard), s.group, id="0", mkstream=True)
        result = await pub.publish("k", {"a": 2})
        assert result.shard_index == shard_for_key("k", 2)
        assert pub.published == 1
    finally:
        await s.close()
        await client.aclose()


async def test_timeouts_are_retried_at_least_once(
    failing_stack: Stack, private_redis_server: RedisServer
) -> None:
    s = failing_stack
    client = _client(private_redis_server, socket_timeout=0.2)
    try:
        pub = s.publisher(redis=client)
        pub.max_attempts = 6
        await pub.start()
        # Writes stall for 0.5 s: the first attempts time out, a later one lands.
        await s.redis.execute_command("CLIENT", "PAUSE", 500, "WRITE")
        result = await pub.publish("k", {"a": 1})
        assert pub.retries >= 1 and pub.published == 1
        # A timed-out XADD may still have been applied: duplicates are allowed,
        # losses are not (at-least-once).
        entries = await s.redis.xrange(result.stream_key)
        assert result.record_id in {rid.decode() for rid, _ in entries}
        assert 1 <= len(entries) <= pub.retries + 1
    finally:
        await s.close()
        await client.aclose()
