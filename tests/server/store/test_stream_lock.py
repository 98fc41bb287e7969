"""``StreamLock.attempt``: the periodic passes' single try at a stream's lock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from streamkit.testing import RedisTarget, redis_client
from streamkit_server.observability.metrics import Metrics
from streamkit_server.store.metadata import MetadataStore
from streamkit_server.store.streams import StreamLock

from ..sim import KEY_PREFIX


@pytest.fixture
async def store(any_redis: RedisTarget) -> AsyncIterator[MetadataStore]:
    client = redis_client(any_redis)
    try:
        yield MetadataStore(client, KEY_PREFIX, Metrics())
    finally:
        await client.aclose()


def _lock(store: MetadataStore) -> StreamLock:
    return StreamLock(store, "locked", ttl_ms=5_000, wait_ms=0)


async def test_an_attempt_on_a_held_stream_is_skipped_and_takes_nothing(
    store: MetadataStore,
) -> None:
    async with _lock(store).attempt() as held:
        assert held
        async with _lock(store).attempt() as other:
            assert not other
        # The refused attempt released nothing: the first one still holds it.
        assert await store.client.exists(store.stream_lock_key("locked"))
    assert not await store.client.exists(store.stream_lock_key("locked"))


async def test_a_taken_lock_is_released_when_the_pass_fails(store: MetadataStore) -> None:
    with pytest.raises(RuntimeError):
        async with _lock(store).attempt() as held:
            assert held
            raise RuntimeError("the pass failed")
    async with _lock(store).attempt() as held:
        assert held
