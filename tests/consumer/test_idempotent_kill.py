"""Exactly-once effects under SIGKILL: a counter kept with staged effects
equals the number of distinct published ids after repeated kills of
consumer processes (standalone Redis and the 3-primary cluster).

Marked ``long``: ``pytest -m long tests/consumer/test_idempotent_kill.py``.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest

from streamkit.publisher.idempotence import IDEMPOTENCY_FIELD
from streamkit.routing import shard_for_key

from .support import Admin, all_acked, effect_count, eventually

# ~20 s per Redis (process starts, member leases running out after each kill).
pytestmark = pytest.mark.long

SHARDS = 4
DISTINCT = 600


async def test_counter_equals_distinct_ids_after_sigkills(
    admin: Admin, redis: Any, names: tuple[str, str], app_process: Any
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, SHARDS)
    rng = random.Random(7)
    # Every id once, a third of them twice more (a duplicate publish that
    # escaped the publisher's window): same id, same shard.
    ids = [f"order-{i}" for i in range(DISTINCT)]
    ids += rng.sample(ids, DISTINCT // 3) * 2
    rng.shuffle(ids)
    for idem in ids:
        shard = shard_for_key(idem, SHARDS)
        await redis.xadd(f"{prefix}:{shard}", {IDEMPOTENCY_FIELD: idem, "v": 1})
    a = app_process("a", prefix, group, module="counting", concurrency=2, sleep_ms=3)
    b = app_process("b", prefix, group, module="counting", concurrency=2, sleep_ms=3)
    kills = 0
    with anyio.fail_after(90):
        for _ in range(3):  # kill each app mid-run, then start it again
            for victim in ("a", "b"):
                before = await effect_count(redis, prefix, SHARDS)
                await eventually(
                    lambda before=before: _moved(redis, prefix, before), 20, "progress"
                )
                proc = a if victim == "a" else b
                proc.kill()
                kills += 1
                await anyio.sleep(0.2)
                fresh = app_process(
                    victim, prefix, group, module="counting", concurrency=2, sleep_ms=3
                )
                a, b = (fresh, b) if victim == "a" else (a, fresh)
                if await all_acked(redis, prefix, group, SHARDS):
                    break
        await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 60, "all acked")
    assert kills >= 2
    assert await effect_count(redis, prefix, SHARDS) == DISTINCT


async def _moved(redis: Any, prefix: str, before: int) -> bool:
    return await effect_count(redis, prefix, SHARDS) > before or await all_acked_any(redis, prefix)


async def all_acked_any(redis: Any, prefix: str) -> bool:
    return await effect_count(redis, prefix, SHARDS) >= DISTINCT
