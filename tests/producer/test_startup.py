"""Fail-fast start-up, lazy start, client ownership and closing."""

from __future__ import annotations

import pytest

from streamkit.coordinator_client import CoordinatorClient
from streamkit.publisher.publisher import (
    CoordinatorUnreachableError,
    PublisherClosedError,
    PublisherStartupError,
    ShardStreamsMissing,
    UnknownGroupError,
)
from streamkit.publisher.routing_cache import RoutingUnavailable
from streamkit.testing import redis_client

from .conftest import Stack, gather


async def test_unknown_group_fails_fast_with_a_clear_error(stack: Stack) -> None:
    await stack.create_group(4)  # the stream exists, the group does not
    pub = stack.publisher(group="nobody")
    with pytest.raises(UnknownGroupError) as caught:
        await pub.start()
    message = str(caught.value)
    assert repr(stack.prefix) in message and "'nobody'" in message
    assert caught.value.stream_prefix == stack.prefix
    assert caught.value.consumer_group == "nobody"
    # The first publish starts the publisher, so it fails the same way ...
    with pytest.raises(UnknownGroupError):
        await pub.publish("k", {"a": 1})
    # ... and so does entering it.
    with pytest.raises(UnknownGroupError):
        async with stack.publisher(group="nobody"):
            pass
    assert pub.published == 0


async def test_missing_or_foreign_shard_keys_fail_start(stack: Stack) -> None:
    await stack.create_group(4)
    await stack.redis.delete(stack.key(2))
    await stack.redis.delete(stack.key(3))
    await stack.redis.set(stack.key(3), "not a stream")
    pub = stack.publisher()
    with pytest.raises(ShardStreamsMissing) as caught:
        await pub.start()
    assert caught.value.found == {stack.key(2): "none", stack.key(3): "string"}
    assert stack.key(2) in str(caught.value) and "never creates" in str(caught.value)
    with pytest.raises(ShardStreamsMissing):
        await pub.publish("k", {"a": 1})
    assert await stack.redis.exists(stack.key(2)) == 0


async def test_a_typo_in_the_group_is_named(stack: Stack) -> None:
    await stack.create_group(2, group="printer")
    with pytest.raises(UnknownGroupError) as caught:
        await stack.publisher(group="printr").start()
    message = str(caught.value)
    assert "did you mean 'printer'?" in message, message
    assert f"streamkit group create {stack.prefix} printr" in message  # or create it


async def test_start_needs_a_reachable_coordinator(stack: Stack) -> None:
    await stack.create_group(2)
    pub = stack.publisher(settings=stack.settings(coordinator_url="http://127.0.0.1:9"))
    with pytest.raises(CoordinatorUnreachableError, match="cannot get producer routing") as down:
        await pub.start()
    message = str(down.value)
    assert "http://127.0.0.1:9" in message and "STREAMKIT_COORDINATOR_URL" in message
    assert "streamkit-server running" in message
    # The message says it all; no chain of HTTP client tracebacks under it.
    assert down.value.__cause__ is None and down.value.__suppress_context__
    user = stack.settings(coordinator_password="wrong")
    with pytest.raises(PublisherStartupError, match="401") as refused:
        await stack.publisher(settings=user).start()
    assert "STREAMKIT_COORDINATOR_USERNAME" in str(refused.value)
    assert "STREAMKIT_COORDINATOR_PASSWORD" in str(refused.value)


async def test_zero_shard_stream_fails_start(stack: Stack) -> None:
    await stack.create_group(2)
    await stack.rewrite_routing(shard_count=0)
    with pytest.raises(RoutingUnavailable) as caught:
        await stack.publisher().start()
    assert caught.value.reason == "no_shards"


async def test_concurrent_first_publishes_share_one_start(stack: Stack) -> None:
    await stack.create_group(4)
    pub = stack.publisher()
    results = await gather(*[lambda i=i: pub.publish(f"k{i}", {"i": i}) for i in range(100)])
    assert all(r.metadata_version == 1 for r in results)
    assert pub.refresher.started == 1  # one routing request for 100 publishes


async def test_concurrent_failed_start_is_one_attempt(stack: Stack) -> None:
    pub = stack.publisher(group="nobody")
    results = await gather(*[lambda: pub.publish("k", {"a": 1}) for _ in range(20)])
    assert all(isinstance(r, UnknownGroupError) for r in results)
    assert pub.refresher.started == 1


async def test_shared_clients_stay_open_owned_ones_close(stack: Stack) -> None:
    await stack.create_group(2)
    user, password = stack.coordinator.admin_auth
    coordinator = CoordinatorClient(stack.coordinator.url, username=user, password=password)
    redis = redis_client(stack.target)
    try:
        async with stack.publisher(coordinator=coordinator, redis=redis) as pub:
            await pub.publish("k", {"a": 1})
        # Closed publisher, shared clients still usable.
        assert await redis.ping()
        assert (await coordinator.get_group(stack.prefix, stack.group)).shard_count == 2
        with pytest.raises(PublisherClosedError):
            await pub.publish("k", {"a": 1})
        with pytest.raises(PublisherClosedError):
            await pub.start()
    finally:
        await coordinator.aclose()
        await redis.aclose()

    owned = stack.publisher()
    await owned.publish("k", {"a": 1})
    await owned.aclose()
    await owned.aclose()  # idempotent
    with pytest.raises(PublisherClosedError):
        await owned.publish("k", {"a": 1})
