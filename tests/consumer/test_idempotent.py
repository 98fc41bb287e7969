"""Idempotent listeners against real Redis (standalone and cluster): markers
skip duplicates, staged effects commit exactly once with the ack, a key in
another slot is refused with one clear error."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from streamkit import CrossSlotEffectError, Idempotence, Message
from streamkit.consumer.idempotence import Effects, marker_key
from streamkit.publisher.idempotence import IDEMPOTENCY_FIELD
from streamkit.routing import redis_cluster_slot
from streamkit.scripts import slot_key

from .support import Admin, InProcessApp, all_acked, effect_count, eventually, serving

SHARDS = 2


async def test_duplicates_are_skipped_and_effects_apply_once(
    admin: Admin, redis: Any, names: tuple[str, str], make_app: InProcessApp
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, SHARDS)
    calls: list[str] = []
    app = make_app("idem")

    @app.stream_listener(stream_prefix=prefix, group=group, idempotent=True, auto_ack=True)
    async def handle(msg: Message) -> None:
        calls.append(msg.idempotency_id)
        msg.effects.hincrby(msg.effects.key("count"), "n", 1)

    async def publish(ids: list[str]) -> None:
        for i in ids:
            shard = int(i.split("-")[1]) % SHARDS
            await redis.xadd(f"{prefix}:{shard}", {IDEMPOTENCY_FIELD: i, "v": 1})

    first = [f"id-{i}" for i in range(40)]
    with anyio.fail_after(30):
        async with serving(app):
            # Within one read, a repeat runs the handler but its commit finds
            # the marker: no second effect.
            await publish(first + first[:10])
            await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 10, "all acked")
            assert await effect_count(redis, prefix, SHARDS) == 40
            handled = len(calls)
            # Later repeats are acked without running the handler.
            await publish(first[10:30])
            await eventually(lambda: all_acked(redis, prefix, group, SHARDS), 10, "repeats acked")
            assert len(calls) == handled
            poller = app.members[0].poller
            assert poller is not None
            assert poller.commit_counts.duplicates_skipped == 30
    assert await effect_count(redis, prefix, SHARDS) == 40
    markers = sum([await redis.zcard(marker_key(f"{prefix}:{s}", group)) for s in range(SHARDS)])
    assert markers == 40


async def test_entry_id_is_the_marker_without_a_publisher_id(
    admin: Admin, redis: Any, names: tuple[str, str], make_app: InProcessApp
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    seen: list[tuple[str, str]] = []
    app = make_app("idem")

    @app.stream_listener(
        stream_prefix=prefix, group=group, idempotent=Idempotence(marker_ttl=60), auto_ack=False
    )
    async def handle(msg: Message) -> None:
        seen.append((msg.id, msg.idempotency_id))
        msg.effects.incrby(msg.effects.key("total"), 2)
        await msg.ack_del()

    entry = (await redis.xadd(f"{prefix}:0", {"v": 1})).decode()
    with anyio.fail_after(20):
        async with serving(app):
            await eventually(lambda: all_acked(redis, prefix, group, 1), 10, "acked")
    assert seen == [(entry, entry)]
    assert await redis.get(slot_key(f"{prefix}:0", "total")) == b"2"
    assert await redis.xlen(f"{prefix}:0") == 0  # ack_del committed with the marker


def test_effect_keys_must_share_the_shard_slot_on_a_cluster() -> None:
    effects = Effects("orders:3", cluster=True)
    key = effects.key("totals")
    assert key == "{orders:3}:totals"
    assert redis_cluster_slot(key) == redis_cluster_slot("orders:3")
    effects.hincrby(key, "n")
    with pytest.raises(CrossSlotEffectError, match=r"msg\.effects\.key\('totals'\)"):
        effects.hincrby("totals", "n")
    with pytest.raises(TypeError):
        effects.set(key, None)  # type: ignore[arg-type]
    # Standalone Redis has one slot for everything: any key commits atomically.
    Effects("orders:3", cluster=False).hincrby("totals", "n")


def test_listener_refuses_a_bad_idempotent_value() -> None:
    from streamkit import StreamKit
    from streamkit.consumer.listener import ListenerConfigError

    app = StreamKit(coordinator_url="http://coordinator:8080")
    with pytest.raises(ListenerConfigError, match="idempotent"):
        app.stream_listener(stream_prefix="p", group="g", idempotent="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="marker_ttl"):
        Idempotence(marker_ttl=0)
