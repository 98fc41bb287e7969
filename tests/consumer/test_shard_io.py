"""One shard's Redis commands (``ShardIO``), on real Redis: the lean read parses
like redis-py's, acks ride along with a read, and ``settle`` acks, deletes and
dead-letters in the combinations the reader sends."""

from __future__ import annotations

from typing import Any

import pytest

from streamkit.connections import connect_redis, send_command
from streamkit.consumer.shard_io import (
    ShardIO,
    read_entries,
    supports_xackdel,
    xreadgroup_command,
)
from streamkit.testing import RedisServer, RedisTarget


@pytest.mark.redis
@pytest.mark.parametrize("protocol", [2, 3])
async def test_a_lean_read_parses_like_redis_py(redis_server: RedisServer, protocol: int) -> None:
    client = connect_redis(redis_server.url, protocol=protocol)
    try:
        key = f"lean:read:{protocol}"
        await client.delete(key)
        await client.xgroup_create(key, "g", "0", mkstream=True)
        await client.xadd(key, {"a": "1", "b": "2"})
        await client.xadd(key, {"c": "é"})
        raw = await send_command(client, *xreadgroup_command("g", "m", key, 10, None))
        parsed = read_entries(raw, raw=True)
        # What redis-py's own XREADGROUP hands back for the same entries (read
        # again from the pending list, id 0), parsed by the same function.
        again = await client.xreadgroup("g", "m", {key: "0"}, count=10)
        assert parsed == read_entries(again, raw=False)
        assert [fields for _, fields in parsed] == [{b"a": b"1", b"b": b"2"}, {b"c": "é".encode()}]
        assert read_entries(None, raw=True) == [] and read_entries({}, raw=False) == []
        # A pending entry trimmed away has no fields.
        await client.xtrim(key, maxlen=0)
        raw = await send_command(
            client, "XREADGROUP", "GROUP", "g", "m", "COUNT", 10, "STREAMS", key, "0"
        )
        assert [fields for _, fields in read_entries(raw, raw=True)] == [None, None]
    finally:
        await client.aclose()


def test_xreadgroup_is_encoded_once() -> None:
    assert xreadgroup_command("g", "m", "s:0", 5, None) == (
        "XREADGROUP", "GROUP", "g", "m", "COUNT", 5, "STREAMS", "s:0", ">"
    )  # fmt: skip
    assert xreadgroup_command("g", "m", "s:0", 5, 100)[6:8] == ("BLOCK", 100)


async def _shard(target: RedisTarget, entries: int) -> tuple[Any, ShardIO, list[bytes]]:
    redis = connect_redis(target.url, cluster=target.cluster)
    key = "io:{shard}:0"
    await redis.xgroup_create(key, "g", "0", mkstream=True)
    ids = [await redis.xadd(key, {"n": str(i)}) for i in range(entries)]
    io = ShardIO(
        redis,
        stream_key=key,
        consumer_group="g",
        member_id="m",
        xackdel=False,
        dead_letter_key="io:{shard}:dlq",
        dead_letter_maxlen=100,
    )
    return redis, io, ids


async def test_acks_ride_along_with_the_next_read(any_redis: RedisTarget) -> None:
    redis, io, ids = await _shard(any_redis, 4)
    try:
        ack, first, _ = await io.read(2, None, [])
        assert ack is None and [i for i, _ in first] == ids[:2]
        ack, second, _ = await io.read(10, None, ids[:2])
        assert ack == 2 and [i for i, _ in second] == ids[2:]
        assert (await redis.xpending(io.stream_key, "g"))["pending"] == 2
    finally:
        await redis.aclose()


async def test_settle_acks_deletes_and_dead_letters_together(any_redis: RedisTarget) -> None:
    redis, io, ids = await _shard(any_redis, 5)
    try:
        _, entries, _ = await io.read(10, None, [])
        assert len(entries) == 5
        letter = {"n": "4", "x-error": "boom"}
        # A cluster dead-letters on its own (another slot); standalone in the MULTI.
        letters = [] if any_redis.cluster else [(letter, ids[4])]
        if any_redis.cluster:
            await io.dead_letter(letter)
            acks = [ids[0], ids[1], ids[4]]
        else:
            acks = [ids[0], ids[1]]
        await io.settle(acks, [ids[2]], letters)
        assert (await redis.xpending(io.stream_key, "g"))["pending"] == 1  # ids[3]
        assert [i for i, _ in await redis.xrange(io.stream_key)] == [ids[0], ids[1], ids[3], ids[4]]
        (dead,) = await redis.xrange(io.dead_letter_key)
        assert dead[1] == {b"n": b"4", b"x-error": b"boom"}
        await io.settle([ids[3]], [], [])  # a lone XACK
        assert (await redis.xpending(io.stream_key, "g"))["pending"] == 0
    finally:
        await redis.aclose()


async def test_the_xackdel_probe_answers_on_a_cluster(
    any_redis: RedisTarget, redis_url: str
) -> None:
    """On a cluster, redis-py refuses a command its copy of the servers'
    command table lacks before sending it; the probe must read that as "no
    XACKDEL" (as a standalone server's "unknown command"), not fail and warn."""
    reference = connect_redis(redis_url)
    client = connect_redis(any_redis.url, cluster=any_redis.cluster)
    try:
        await client.ping()  # a client in use (it has loaded the command table)
        assert await supports_xackdel(client) == await supports_xackdel(reference)
    finally:
        await client.aclose()
        await reference.aclose()
