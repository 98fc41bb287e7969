"""Two ``streamkit run`` processes share a group: ownership, crash, restart.

Real coordinator process, real Redis (standalone and cluster), real
processes; the single-reader check uses the read intervals the apps record,
the single-processor check the handler calls they record.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from streamkit.coordinator_client import CoordinatorClient
from streamkit.publisher.publisher import Publisher
from streamkit.testing.coordinator import CoordinatorProcess

from .support import (
    Admin,
    all_acked,
    eventually,
    logical,
    overlapping_processing,
    overlapping_reads,
    parse_records,
    settled_ownership,
)

pytestmark = pytest.mark.slow

SHARDS = 8
A = ["a-m0", "a-m1"]
B = ["b-m0", "b-m1"]


async def publish(publisher: Publisher, start: int, count: int) -> set[str]:
    results = await publisher.publish_many(
        (f"key-{i}", {"n": str(i), "pad": "x" * 64}) for i in range(start, start + count)
    )
    return {f"{r.stream_key}/{r.record_id}" for r in results}


async def pending_by_consumer(redis: Any, prefix: str, group: str) -> dict[str, int]:
    totals: dict[str, int] = {}
    for shard in range(SHARDS):
        summary = await redis.xpending(f"{prefix}:{shard}", group)
        for consumer in summary["consumers"] or []:
            name = consumer["name"]
            name = name.decode() if isinstance(name, bytes) else name
            name = logical(name)  # a restarted process's members add to the same name
            totals[name] = totals.get(name, 0) + int(consumer["pending"])
    return totals


async def test_two_apps_share_crash_and_rebalance_back(
    coordinator: CoordinatorProcess,
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    app_process: Any,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, SHARDS)
    a = app_process("a", prefix, group, concurrency=2, sleep_ms=2)
    b = app_process("b", prefix, group, concurrency=2, sleep_ms=2)

    async def settled(members: list[str]) -> bool:
        return settled_ownership(await admin.owners(prefix, group), members, SHARDS)

    await eventually(lambda: settled(A + B), 30, "8 shards held once each by 4 members")

    user, password = coordinator.admin_auth
    async with CoordinatorClient(coordinator.url, username=user, password=password) as client:
        publisher = Publisher(prefix, group, coordinator=client, redis=redis)
        published = await publish(publisher, 0, 4_000)
        await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 30, "first wave acked")

        # Crash app A while it holds unacked entries.
        published |= await publish(publisher, 4_000, 4_000)

        async def a_has_pending() -> bool:
            pending = await pending_by_consumer(redis, prefix, group)
            return sum(pending.get(m, 0) for m in A) > 0

        await eventually(a_has_pending, 10, "app A holding pending entries")
        a.kill()
        pending = await pending_by_consumer(redis, prefix, group)
        left_by_a = sum(pending.get(m, 0) for m in A)
        assert left_by_a > 0
        # After A's member lease runs out, B takes every shard and claims A's entries.
        await eventually(lambda: settled(B), 15, "B holding all shards after A's lease")
        await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 30, "A's entries acked")
        pending = await pending_by_consumer(redis, prefix, group)
        assert all(pending.get(m, 0) == 0 for m in A)

        # Restart A (new member ids, same base): shards come back with minimal moves.
        before = await admin.owners(prefix, group)
        a2 = app_process("a", prefix, group, concurrency=2, sleep_ms=2)
        published |= await publish(publisher, 8_000, 2_000)
        await eventually(lambda: settled(A + B), 30, "rebalanced over 4 members again")
        after = await admin.owners(prefix, group)
        for member in B:
            assert set(after[member]) <= set(before[member]), (before, after)
        await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 30, "third wave acked")

        # XINFO CONSUMERS: in a last wave, only each shard's owner delivers.
        # (Redis 7.0 counts a consumer's idle time from its last delivery.)
        raw_owners = await admin.owners(prefix, group, raw=True)  # Redis consumer names
        owners = {s: m for m, shards in raw_owners.items() for s in shards}
        wave_start = time.monotonic()
        published |= await publish(publisher, 10_000, 400)
        await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 30, "last wave acked")
        await publisher.aclose()
    for shard in range(SHARDS):
        since_wave_ms = (time.monotonic() - wave_start) * 1000
        consumers = {
            (c["name"].decode() if isinstance(c["name"], bytes) else c["name"]): c
            for c in await redis.xinfo_consumers(f"{prefix}:{shard}", group)
        }
        owner = consumers.pop(owners[shard])
        assert owner["pending"] == 0
        assert owner["idle"] < since_wave_ms, (shard, owner)
        for name, other in consumers.items():
            assert other["pending"] == 0, (shard, name)
            assert other["idle"] >= since_wave_ms - 50, (shard, owner, name, other)

    assert await a2.terminate() == 0
    assert await b.terminate() == 0
    died = {p.pid: p.died_ns for p in (a, a2, b)}
    records = parse_records([a.record, a2.record, b.record], died)
    assert not overlapping_reads(records.reads)
    # Exclusivity of processing, not only of reads: handler calls of one shard
    # by two members never overlap (A's calls cut short by SIGKILL end at its death).
    assert records.processing, "no handler call recorded"
    overlaps = overlapping_processing(records.processing, records.lost)
    assert not overlaps, overlaps[:5]
    assert published <= set(records.handled), len(published - set(records.handled))
