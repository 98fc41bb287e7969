"""SIGTERM on ``streamkit run``: drain, ack, leave with epoch -1, and the
coordinator hands the shards over at once (no lease wait)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from streamkit.testing.coordinator import CoordinatorProcess

from .support import Admin, all_acked, eventually, parse_records, settled_ownership

pytestmark = pytest.mark.slow

SHARDS = 8
A = ["a-m0", "a-m1"]
B = ["b-m0", "b-m1"]
MEMBER_LEASE_TTL_MS = 1_500


async def test_sigterm_drains_acks_and_leaves(
    coordinator: CoordinatorProcess,
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    app_process: Any,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, SHARDS)
    a = app_process("a", prefix, group, concurrency=2, sleep_ms=5)
    b = app_process("b", prefix, group, concurrency=2, sleep_ms=5)

    async def settled(members: list[str]) -> bool:
        return settled_ownership(await admin.owners(prefix, group), members, SHARDS)

    with anyio.fail_after(60):
        await eventually(lambda: settled(A + B), 30, "4 members sharing 8 shards")
        published = set()
        for i in range(2_000):
            key = f"{prefix}:{i % SHARDS}"
            published.add(f"{key}/{(await redis.xadd(key, {'n': str(i)})).decode()}")
        await anyio.sleep(0.3)  # A is busy with its shards now

        assert await a.terminate(within=10) == 0, a.logs()
        exited = time.monotonic()
        await eventually(lambda: settled(B), 5, "B holding every shard")
        handover_ms = (time.monotonic() - exited) * 1000
        # A lease expiry would take the member lease TTL; a leave is immediate.
        assert handover_ms < MEMBER_LEASE_TTL_MS * 2 / 3, handover_ms

        members = await admin.members(prefix, group)
        live = {m.member_id for m in members.members if m.state and m.state.value == "ACTIVE"}
        assert not live & set(A), members
        assert a.logs().count("left the group") == 2, a.logs()

        # Drained and acked: nothing A's handlers finished is still pending for A.
        records = parse_records([a.record], {a.pid: a.died_ns or 0})
        handled_by_a = set(records.handled)
        still_pending = set()
        for shard in range(SHARDS):
            key = f"{prefix}:{shard}"
            for member in A:
                for entry in await redis.xpending_range(key, group, "-", "+", 10_000, member):
                    still_pending.add(f"{key}/{entry['message_id'].decode()}")
        assert handled_by_a, "A handled nothing before SIGTERM: the test proves nothing"
        assert not handled_by_a & still_pending

        await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 30, "all acked by B")
        assert await b.terminate() == 0
    records = parse_records([a.record, b.record], {a.pid: a.died_ns or 0, b.pid: b.died_ns or 0})
    assert published <= set(records.handled)
