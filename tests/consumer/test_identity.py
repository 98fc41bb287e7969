"""Two ``streamkit run`` processes on one host with identical settings.

The first thing anyone does to scale out is to start the same command twice.
Each start draws its own incarnation, so the two processes are four distinct
members that share the shards; nobody reads a shard another reads.  With
static membership and one base, the second process reads nothing while the
first lives, says why, and takes over once the first is gone and its lease
has run out.  Real coordinator, real Redis, real processes.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamkit.coordinator_client import CoordinatorClient
from streamkit.publisher.publisher import Publisher
from streamkit.testing.coordinator import CoordinatorProcess

from .support import (
    Admin,
    AppProcess,
    all_acked,
    eventually,
    overlapping_processing,
    overlapping_reads,
    parse_records,
    settled_ownership,
)

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)]

SHARDS = 8


async def members_of(admin: Admin, prefix: str, group: str, proc: AppProcess) -> dict[str, str]:
    """member id -> state, for the members of one process (named ``host/pid``)."""
    body = await admin.members(prefix, group)
    return {
        m.member_id: str(m.state)
        for m in body.members
        if m.member_id and (m.member_name or "").endswith(f"/{proc.pid}")
    }


async def consumer_names(redis: Any, prefix: str, group: str) -> set[str]:
    names: set[str] = set()
    for shard in range(SHARDS):
        for consumer in await redis.xinfo_consumers(f"{prefix}:{shard}", group):
            name = consumer["name"]
            names.add(name.decode() if isinstance(name, bytes) else name)
    return names


async def _none_left(redis: Any, prefix: str, group: str, names: set[str]) -> bool:
    return not await consumer_names(redis, prefix, group) & names


async def publish(publisher: Publisher, start: int, count: int) -> set[str]:
    results = await publisher.publish_many(
        (f"key-{i}", {"n": str(i)}) for i in range(start, start + count)
    )
    return {f"{r.stream_key}/{r.record_id}" for r in results}


async def test_identical_processes_are_distinct_members(
    coordinator: CoordinatorProcess,
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    app_process: Any,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, SHARDS)
    first = app_process("pod", prefix, group, concurrency=2, sleep_ms=1)
    second = app_process("pod", prefix, group, concurrency=2, sleep_ms=1)

    async def owned_by(procs: list[AppProcess], count: int) -> bool:
        ids: set[str] = set()
        for proc in procs:
            ids |= set(await members_of(admin, prefix, group, proc))
        owners = await admin.owners(prefix, group, raw=True)
        return len(ids) == count and settled_ownership(owners, ids, SHARDS)

    await eventually(lambda: owned_by([first, second], 4), 30, "4 members holding 8 shards")
    ids_first = set(await members_of(admin, prefix, group, first))
    ids_second = set(await members_of(admin, prefix, group, second))
    assert not ids_first & ids_second
    assert all(m.startswith("pod-") for m in ids_first | ids_second)

    user, password = coordinator.admin_auth
    async with CoordinatorClient(coordinator.url, username=user, password=password) as client:
        publisher = Publisher(prefix, group, coordinator=client, redis=redis)
        published = await publish(publisher, 0, 2_000)
        # SIGTERM: the second process drains and leaves; its shards move at
        # once (a leave, not a lease expiry).
        published |= await publish(publisher, 2_000, 2_000)
        assert await second.terminate() == 0, second.logs()
        states = await members_of(admin, prefix, group, second)
        assert set(states.values()) == {"LEAVING"}, states
        # Its Redis consumer names are never used again: the new owners delete
        # them once they claimed what they had pending.
        await eventually(
            lambda: _none_left(redis, prefix, group, set(states)), 10, "old consumers deleted"
        )
        await eventually(lambda: owned_by([first], 2), 10, "the first process holds all")
        # A third identical process joins; SIGKILL moves its shards after its lease.
        third = app_process("pod", prefix, group, concurrency=2, sleep_ms=1)
        await eventually(lambda: owned_by([first, third], 4), 30, "shared with a third")
        published |= await publish(publisher, 4_000, 2_000)
        third.kill()
        await eventually(lambda: owned_by([first], 2), 15, "the first holds all again")
        states = await members_of(admin, prefix, group, third)
        assert set(states.values()) == {"EXPIRED"}, states
        await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 30, "everything acked")
        await publisher.aclose()
    assert await first.terminate() == 0
    records = parse_records(
        [p.record for p in (first, second, third)],
        {p.pid: p.died_ns for p in (first, second, third)},
    )
    assert records.reads, "nothing was read"
    assert not overlapping_reads(records.reads)
    # Every message handled by one process at a time (handler calls too).
    assert records.processing, "no handler call recorded"
    overlaps = overlapping_processing(records.processing, records.lost)
    assert not overlaps, overlaps[:5]
    assert published <= set(records.handled)


async def test_same_static_member_id_waits_for_the_first_process(
    admin: Admin, names: tuple[str, str], app_process: Any
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 4)
    static = {"STREAMKIT_STATIC_MEMBERSHIP": "true"}
    first = app_process("fixed", prefix, group, settings=static)
    await eventually(
        lambda: _owners_are(admin, prefix, group, {"fixed-m0": [0, 1, 2, 3]}), 20, "first owns"
    )
    second = app_process("fixed", prefix, group, settings=static)
    await eventually(lambda: "MEMBER_ID_IN_USE" in second.logs(), 10, "the second says why")
    assert "STREAMKIT_MEMBER_ID_BASE" in second.logs()
    assert await members_of(admin, prefix, group, second) == {}
    assert set(await members_of(admin, prefix, group, first)) == {"fixed-m0"}

    first.kill()
    await eventually(
        lambda: _owners_are(admin, prefix, group, {"fixed-m0": [0, 1, 2, 3]}, second),
        20,
        "the second takes over after the first's lease",
    )
    assert "the member id is free again" in second.logs()
    assert await second.terminate() == 0
    records = parse_records([first.record, second.record], {first.pid: first.died_ns})
    assert not overlapping_reads(records.reads)


async def _owners_are(
    admin: Admin,
    prefix: str,
    group: str,
    expected: dict[str, list[int]],
    proc: AppProcess | None = None,
) -> bool:
    if await admin.owners(prefix, group, raw=True) != expected:
        return False
    return proc is None or set(await members_of(admin, prefix, group, proc)) == set(expected)


async def test_static_rolling_restart_moves_nothing(
    any_redis: Any, coordinator_factory: Any, names: tuple[str, str], app_process: Any
) -> None:
    """A static member that stops gracefully keeps its shards reserved for its
    restart; the other process's share never changes meanwhile."""
    # A lease long enough that the restart (a new Python process) comes back
    # within it even on a loaded machine.
    coordinator = coordinator_factory(any_redis, member_lease_ttl_ms=30_000)
    admin = Admin(coordinator)
    prefix, group = names
    await admin.create_group(prefix, group, 4)
    static = {"STREAMKIT_STATIC_MEMBERSHIP": "true"}
    a = app_process("a", prefix, group, settings=static, coordinator_process=coordinator)
    b = app_process("b", prefix, group, settings=static, coordinator_process=coordinator)

    async def spread() -> bool:
        owners = await admin.owners(prefix, group, raw=True)
        return settled_ownership(owners, ["a-m0", "b-m0"], 4)

    await eventually(spread, 30, "a and b share 4 shards")
    before = await admin.owners(prefix, group, raw=True)
    assert await a.terminate() == 0, a.logs()
    assert "a-m0: left the group" in a.logs()
    states = {m.member_id: str(m.state) for m in (await admin.members(prefix, group)).members}
    assert states["a-m0"] == "ACTIVE", states  # reserved, not gone
    a2 = app_process("a", prefix, group, settings=static, coordinator_process=coordinator)

    async def a2_back() -> bool:
        return await admin.owners(prefix, group, raw=True) == before and set(
            await members_of(admin, prefix, group, a2)
        ) == {"a-m0"}

    await eventually(a2_back, 25, "a's restart back on its own shards")
    # b never held a's shards while a restarted.
    assert "b-m0: assigned shards" in b.logs()
    assert b.logs().count("assigned shards") == 1, b.logs()
    assert await a2.terminate() == 0
    assert await b.terminate() == 0
