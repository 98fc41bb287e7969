"""The steady-write script's group commit, against a real redis-server.

Each call must get exactly its own reply or its own error, whether it went
alone or in a shared pipeline; a lone call goes alone; Redis losing its
script cache between calls costs nothing but a reload; a waiter that gives
up does not disturb the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.exceptions import ResponseError

from streamkit.testing import RedisServer, RedisTarget, redis_client
from streamkit_server.store.batch import ScriptBatcher
from streamkit_server.store.records import RedisClient

# KEYS[1] a counter; ARGV[1] a tag.  Fails on the tag "bad", else returns the
# tag and the counter's new value (so each reply names its own call).
SCRIPT = """
if ARGV[1] == 'bad' then return redis.error_reply('BAD refused ' .. ARGV[1]) end
return {ARGV[1], redis.call('INCR', KEYS[1])}
"""


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[RedisClient]:
    redis_server.flushall()
    client = redis_client(RedisTarget(redis_server.url, cluster=False))
    try:
        yield client
    finally:
        await client.aclose()


async def test_a_lone_call_goes_alone(client: RedisClient) -> None:
    batcher = ScriptBatcher(client, client.register_script(SCRIPT))
    for n in range(1, 4):
        assert await batcher(["c"], ["solo"]) == [b"solo", n]
    assert batcher.batches == 0


@pytest.mark.parametrize("max_in_flight", [1, 2, 4])
async def test_concurrent_calls_share_pipelines_and_each_gets_its_own_reply(
    client: RedisClient, max_in_flight: int
) -> None:
    batcher = ScriptBatcher(client, client.register_script(SCRIPT), max_in_flight=max_in_flight)
    tags = [f"t{i}" for i in range(200)]
    replies = await asyncio.gather(
        *(batcher([f"c{i % 7}"], [tag]) for i, tag in enumerate(tags)),
        *(batcher(["c-bad"], ["bad"]) for _ in range(3)),
        return_exceptions=True,
    )
    good, bad = replies[:200], replies[200:]
    assert [r[0] for r in good] == [t.encode() for t in tags]  # type: ignore[index]
    # Every increment happened once: per counter, the values are 1..n.
    for k in range(7):
        values = sorted(r[1] for i, r in enumerate(good) if i % 7 == k)  # type: ignore[index]
        assert values == list(range(1, len(values) + 1))
    assert all(isinstance(r, ResponseError) and "BAD" in str(r) for r in bad)
    assert batcher.batches >= 1 and batcher.batched_calls > batcher.batches
    # The first ``max_in_flight`` calls went alone; the rest queued behind them.
    assert batcher.batched_calls == 203 - max_in_flight


async def test_a_flushed_script_cache_is_reloaded_for_a_batch(client: RedisClient) -> None:
    batcher = ScriptBatcher(client, client.register_script(SCRIPT))
    assert await batcher(["c"], ["first"]) == [b"first", 1]
    await client.script_flush()
    replies = await asyncio.gather(*(batcher(["c"], [f"t{i}"]) for i in range(20)))
    assert sorted(r[1] for r in replies) == list(range(2, 22))
    assert batcher.batched_calls >= 1


async def test_a_waiter_that_gives_up_leaves_the_others_their_replies(
    client: RedisClient,
) -> None:
    batcher = ScriptBatcher(client, client.register_script(SCRIPT), max_in_flight=1)
    first = asyncio.create_task(batcher(["c"], ["first"]))
    await asyncio.sleep(0)  # the first call is in flight; the rest queue
    quitter = asyncio.create_task(batcher(["c"], ["quitter"]))
    others = [asyncio.create_task(batcher(["c"], [f"t{i}"])) for i in range(5)]
    await asyncio.sleep(0)
    quitter.cancel()
    assert (await first)[0] == b"first"
    assert [(await o)[0] for o in others] == [f"t{i}".encode() for i in range(5)]
    with pytest.raises(asyncio.CancelledError):
        await quitter
    # The cancelled call was dropped before sending: five increments after the first.
    assert int(await client.get("c")) == 6
