"""The ``RETAIN`` script trims exactly what ``core/retention.py`` allows, on a real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamkit.routing import stream_key
from streamkit.testing import RedisTarget, redis_client
from streamkit_server.coordination.retention import Trimmer
from streamkit_server.core.retention import (
    GroupPosition,
    RetentionPolicy,
    StreamId,
    group_floor,
    parse_id,
    plan_trim,
)

groups_st = st.lists(
    st.tuples(st.integers(0, 30), st.sets(st.integers(0, 29))),  # (read, acked positions)
    max_size=3,
)


async def _scenario(
    url: str,
    offsets: list[int],
    groups: list[tuple[int, set[int]]],
    policy: RetentionPolicy,
    missing_group: bool,
    scan_limit: int,
) -> None:
    client = redis_client(RedisTarget(url, False), decode_responses=True)
    prefix = f"ret-{uuid.uuid4().hex[:8]}"
    key = stream_key(prefix, 0)
    try:
        base = int(time.time() * 1000) - 200_000
        ids = []
        for offset in sorted(set(offsets)):
            ids.append(await client.xadd(key, {"n": "1"}, id=f"{base + offset}-1"))
        names = []
        positions: list[GroupPosition] = []
        for i, (read, acked) in enumerate(groups):
            name = f"g{i}"
            names.append(name)
            await client.xgroup_create(key, name, id="0", mkstream=True)
            got = await client.xreadgroup(name, "c", {key: ">"}, count=read) if read else []
            delivered = [entry_id for _, entries in got for entry_id, _ in entries]
            done = [d for j, d in enumerate(delivered) if j in acked]
            if done:
                await client.xack(key, name, *done)
            pending = [d for d in delivered if d not in done]
            positions.append(
                GroupPosition(
                    name,
                    parse_id(delivered[-1]) if delivered else (0, 0),
                    min(parse_id(p) for p in pending) if pending else None,
                )
            )
        expected = [*names, "absent"] if missing_group else names
        before = [parse_id(i) for i in ids]
        trim = await Trimmer(client, scan_limit).trim(prefix, 0, policy, expected)
        floor, holder = group_floor(positions, expected, empty=not ids)
        assert (trim.floor, trim.holder) == ((floor, holder) if ids else (None, None))
        # The core's plan from the true facts (the length cut counted here); a
        # call that could not look far enough trims at most ``scan_limit``.
        true_cut = None
        if policy.max_length is not None and len(ids) > policy.max_length:
            drop = len(ids) - policy.max_length
            true_cut = before[min(drop, scan_limit) if trim.more else drop]
            if trim.length_cut is not None:
                assert trim.length_cut == before[min(drop, scan_limit)]
        assert not trim.more or drop > scan_limit
        plan = plan_trim(policy, trim.now_ms, true_cut, floor, holder)
        assert trim.blocked == (plan.blocked and bool(ids))
        after = [parse_id(i) for i, _ in await client.xrange(key)]
        kept: list[StreamId] = (
            before if plan.min_id is None or not ids else [i for i in before if i >= plan.min_id]
        )
        assert after == kept
        assert trim.trimmed == len(before) - len(after)
        # Whatever the plan: nothing a group still needs is gone.
        for g in positions:
            needed = [i for i in before if i > g.last_delivered]
            if g.pending_min is not None:
                needed += [i for i in before if i >= g.pending_min]
            assert set(needed) <= set(after)
        if missing_group and ids:
            assert after == before
    finally:
        await client.delete(key)
        await client.aclose()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    offsets=st.lists(st.integers(0, 199_000), max_size=30),
    groups=groups_st,
    max_age=st.none() | st.integers(1, 250_000),
    max_length=st.none() | st.integers(1, 35),
    missing_group=st.booleans(),
    scan_limit=st.sampled_from([2, 10_000]),
)
def test_the_script_agrees_with_the_rules(
    redis_url: str,
    offsets: list[int],
    groups: list[tuple[int, set[int]]],
    max_age: int | None,
    max_length: int | None,
    missing_group: bool,
    scan_limit: int,
) -> None:
    policy = RetentionPolicy(max_age, max_length)
    asyncio.run(_scenario(redis_url, offsets, groups, policy, missing_group, scan_limit))


async def test_one_key_per_call_on_the_cluster(cluster_url: str) -> None:
    """Shards of a stream live in different slots; each call touches one of them."""
    client = redis_client(RedisTarget(cluster_url, True), decode_responses=True)
    try:
        trimmer = Trimmer(client)
        slots: set[Any] = set()
        for shard in range(4):
            key = stream_key("spread", shard)
            slots.add(await client.cluster_keyslot(key))
            for _ in range(5):
                await client.xadd(key, {"n": "1"})
            await client.xgroup_create(key, "g", id="0")
            await client.xreadgroup("g", "c", {key: ">"}, count=3)
            trim = await trimmer.trim("spread", shard, RetentionPolicy(max_length=1), ["g"])
            # Read 3, none acked: the oldest pending entry holds retention back.
            assert trim.trimmed == 0 and trim.holder == "g" and trim.blocked
            await client.xack(key, "g", *[i for i, _ in await client.xrange(key, count=3)])
            trim = await trimmer.trim("spread", shard, RetentionPolicy(max_length=1), ["g"])
            assert trim.trimmed == 2  # up to its last delivered entry, which stays
            assert await client.xlen(key) == 3
        assert len(slots) > 1
    finally:
        await client.aclose()
