"""Resharding end to end: real ``StreamKit`` consumers, a real ``Publisher`` under
steady load, a real coordinator process, real Redis (standalone and cluster).

Guarantees checked: nothing published is lost, every message of an added or
removed shard is acked, removed shards are deleted only after they drained,
(ordered mode) each key's messages are handled in publish order, and handler
calls of one shard never overlap between members.
Duplicates and, without ordered mode, reorderings are counted and reported,
not asserted: at-least-once allows them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import anyio
import pytest
from consumer.support import overlapping_processing
from helpers import AppProcess

from streamkit import Message, StreamKit
from streamkit.consumer.failure import FailurePolicy
from streamkit.publisher.routing_cache import RoutingUnavailable
from streamkit.testing import AsyncRedisClient, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from .support import Admin, eventually
from .traffic import Sink, Traffic, client_settings, consumer, publisher, publishing, serving

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
Report = Callable[[str, object], None]


@pytest.fixture
def report(record_property: Report) -> Report:
    """Figures a test measured: printed (``-s``/``-rP``) and kept in the junit XML."""

    def emit(name: str, value: object) -> None:
        print(f"[resharding] {name}: {value}")
        record_property(name, value)

    return emit


async def settled(admin: Admin, prefix: str, group: str, members: int, shards: int) -> None:
    async def check() -> bool:
        body = (await admin.get(f"/monitoring/streams/{prefix}/groups/{group}/assignments")).json()
        held = [s["shardIndex"] for v in body["currentAssignments"].values() for s in v]
        return len(body["currentAssignments"]) == members and sorted(held) == list(range(shards))

    await eventually(check, 15, f"{members} members holding {shards} shards", interval=0.1)


async def all_handled(sink: Sink, expected: Iterable[int], within: float = 20) -> None:
    wanted = set(expected)

    async def check() -> bool:
        return wanted <= set(sink.counts())

    try:
        await eventually(check, within, "every published message handled", interval=0.1)
    except AssertionError:
        missing = sorted(wanted - set(sink.counts()))
        raise AssertionError(f"{len(missing)} messages never handled: {missing[:20]}") from None


async def fully_acked(r: AsyncRedisClient, keys: Iterable[str]) -> None:
    """Every consumer group on every key: nothing pending, nothing unread."""
    keys = list(keys)

    async def check() -> bool:
        for key in keys:
            for info in await r.xinfo_groups(key):
                if info["pending"] != 0 or info["lag"] != 0:
                    return False
        return True

    await eventually(check, 10, f"{keys} fully acked", interval=0.1)


def duplicates(sink: Sink) -> int:
    return sum(c - 1 for c in sink.counts().values())


def one_processor_per_shard(sink: Sink) -> None:
    """Handler calls of one shard by two members never overlapped in time.

    These tests fence nobody, so the documented exception (a handler still
    running when its member was fenced) does not apply.
    """
    assert sink.calls, "no handler call recorded"
    overlaps = overlapping_processing(sink.calls)
    assert not overlaps, overlaps[:5]


async def scale_under_load(
    coord: CoordinatorProcess,
    any_redis: RedisTarget,
    admin: Admin,
    r: AsyncRedisClient,
    prefix: str,
    shards: int,
    to: int,
) -> tuple[Sink, Traffic, str, float]:
    """Three consumers and a steady publisher on ``shards`` shards, scaled to
    ``to`` under load; returns once the migration is DEPRECATED and everything
    published was handled and acked: (sink, traffic, request id, switch time)."""
    await admin.create_group(prefix, "g", shards)
    sink = Sink()
    apps = [consumer(coord, any_redis, f"c{i}", prefix, "g", sink) for i in range(3)]
    traffic = Traffic(publisher(coord, any_redis, prefix, "g"))
    async with serving(*apps):
        await settled(admin, prefix, "g", 3, shards)
        async with publishing(traffic):
            await anyio.sleep(1.0)
            switch = time.time()
            rid = await admin.scale_ok(prefix, to)
            await admin.wait_state(prefix, ["g"], rid, "DEPRECATED", within=15)
            await anyio.sleep(0.5)
        await all_handled(sink, traffic.published)
        await fully_acked(r, [f"{prefix}:{s}" for s in range(to)])
    assert (await admin.routing(prefix, "g"))["shardCount"] == to
    one_processor_per_shard(sink)
    return sink, traffic, rid, switch


async def test_scale_out_under_load(
    coord: CoordinatorProcess,
    any_redis: RedisTarget,
    admin: Admin,
    r: AsyncRedisClient,
    prefix: str,
    report: Report,
) -> None:
    sink, traffic, _, _ = await scale_under_load(coord, any_redis, admin, r, prefix, 4, 8)
    on_new = [n for n, res in traffic.published.items() if res.shard_index >= 4]
    assert on_new, "the publisher never used the new shards"
    assert not traffic.refused
    report("scale_out.published", len(traffic.published))
    report("scale_out.on_added_shards", len(on_new))
    report("scale_out.duplicates", duplicates(sink))


async def test_scale_in_under_load(
    coord: CoordinatorProcess,
    any_redis: RedisTarget,
    admin: Admin,
    r: AsyncRedisClient,
    prefix: str,
    report: Report,
) -> None:
    removed = {f"{prefix}:{s}" for s in range(3, 8)}
    sink, traffic, rid, switch = await scale_under_load(coord, any_redis, admin, r, prefix, 8, 3)
    assert await r.exists(*removed) == 0
    migration = await admin.migration(prefix, "g", rid)
    assert migration["retiredShards"] == [3, 4, 5, 6, 7]
    to_removed = [n for n, res in traffic.published.items() if res.stream_key in removed]
    before_switch = [n for n in to_removed if traffic.sent_at[n] < switch]
    after_switch = len(to_removed) - len(before_switch)
    # Written to a removed shard before the switch, and still consumed.
    assert before_switch and set(to_removed) <= set(sink.counts())
    report("scale_in.published", len(traffic.published))
    report("scale_in.to_removed_before_switch", len(before_switch))
    report("scale_in.to_removed_after_switch(cached routing)", after_switch)
    report("scale_in.duplicates", duplicates(sink))


def start_app(
    coordinator: CoordinatorProcess, target: RedisTarget, record: Path, **env: str
) -> AppProcess:
    settings = client_settings(coordinator, target, "doomed")
    environment = {f"STREAMKIT_{k.upper()}": str(v) for k, v in settings.items()}
    environment["STREAMKIT_REDIS_CLUSTER"] = "true" if target.cluster else "false"
    environment.update({"RSK_RECORD": str(record), **env})
    app = AppProcess("tests.resharding.apps.recorder:app", environment, record.with_suffix(".log"))
    return app.start()


async def test_scale_in_with_every_member_dead(
    coord: CoordinatorProcess,
    any_redis: RedisTarget,
    admin: Admin,
    r: AsyncRedisClient,
    prefix: str,
    tmp_path: Path,
    report: Report,
) -> None:
    await admin.create_group(prefix, "g", 4)
    record = tmp_path / "doomed.rec"
    proc = start_app(
        coord, any_redis, record, RSK_PREFIX=prefix, RSK_GROUP="g", RSK_CONCURRENCY="2"
    )
    pub = publisher(coord, any_redis, prefix, "g")
    published: dict[int, str] = {}
    try:
        await settled(admin, prefix, "g", 2, 4)
        for n in range(60):
            published[n] = (await pub.publish(f"k{n}", _fields(n))).stream_key
        await eventually(
            lambda: _true(len(record.read_text().splitlines()) >= 60), 10, "the app read it all"
        )
        proc.kill()  # no leave, no revoke: the members just vanish
        for n in range(60, 160):
            published[n] = (await pub.publish(f"k{n}", _fields(n))).stream_key
        rid = await admin.scale_ok(prefix, 2)
        await anyio.sleep(3.5)  # member lease and producer lease both long gone
        members = (await admin.get(f"/monitoring/streams/{prefix}/groups/g/members")).json()
        assert {m["state"] for m in members["members"]} == {"EXPIRED"}
        migration = await admin.migration(prefix, "g", rid)
        assert migration["state"] == "DRAINING"  # nobody to revoke, but Redis is not drained
        assert await r.exists(f"{prefix}:2", f"{prefix}:3") == 2

        sink = Sink()  # a consumer started later drains them
        async with serving(consumer(coord, any_redis, "later", prefix, "g", sink)):
            await admin.wait_state(prefix, ["g"], rid, "DEPRECATED", within=15)
        by_app = {int(line.split()[0]) for line in record.read_text().splitlines()}
        assert set(published) <= by_app | set(sink.counts())
        assert await r.exists(f"{prefix}:2", f"{prefix}:3") == 0
        report("dead_members.read_by_later_consumer", len(set(sink.counts())))
    finally:
        await pub.aclose()
        proc.cleanup()


async def _true(value: bool) -> bool:
    return value


def _fields(n: int) -> dict[str, str | int]:
    return {"n": n, "key": f"k{n}", "seq": 0, "at": repr(time.time())}


async def test_scale_to_zero_fails_publishing_closed(
    coord: CoordinatorProcess,
    any_redis: RedisTarget,
    admin: Admin,
    r: AsyncRedisClient,
    prefix: str,
    report: Report,
) -> None:
    await admin.create_group(prefix, "g", 3)
    sink = Sink()
    apps = [consumer(coord, any_redis, f"c{i}", prefix, "g", sink) for i in range(2)]
    traffic = Traffic(publisher(coord, any_redis, prefix, "g"))
    async with serving(*apps):
        await settled(admin, prefix, "g", 2, 3)
        async with publishing(traffic):
            await anyio.sleep(0.8)
            rid = await admin.scale_ok(prefix, 0)
            await eventually(lambda: _true(bool(traffic.refused)), 5, "publishing refused")
            with pytest.raises(RoutingUnavailable) as refused:
                await traffic.publisher.publish("any", {"n": -1})
            assert refused.value.reason == "no_shards"
            await admin.wait_state(prefix, ["g"], rid, "DEPRECATED", within=15)
        await all_handled(sink, traffic.published)
    assert await r.exists(*[f"{prefix}:{s}" for s in range(3)]) == 0
    report("zero.published_before_refusal", len(traffic.published))
    report("zero.refused", len(traffic.refused))
    report("zero.duplicates", duplicates(sink))
    one_processor_per_shard(sink)


@pytest.mark.parametrize("ordering", ["key", "none"])
async def test_per_key_order_across_a_scale(
    coord: CoordinatorProcess,
    any_redis: RedisTarget,
    admin: Admin,
    prefix: str,
    ordering: str,
    report: Report,
) -> None:
    """Ordered mode: each key's messages are handled in publish order.  Without
    it the test only records what happened (order across a scale is not kept)."""
    await admin.create_stream(prefix, 4, ordering=ordering)
    await admin.create_group(prefix, "g")
    sink = Sink()
    apps = [consumer(coord, any_redis, f"c{i}", prefix, "g", sink) for i in range(3)]
    traffic = Traffic(publisher(coord, any_redis, prefix, "g"), rate=250)
    async with serving(*apps):
        await settled(admin, prefix, "g", 3, 4)
        async with publishing(traffic):
            await anyio.sleep(1.0)
            switch = time.time()
            rid = await admin.scale_ok(prefix, 8)
            await admin.wait_state(prefix, ["g"], rid, "DEPRECATED", within=15)
            await anyio.sleep(0.5)
        await all_handled(sink, traffic.published)
    out_of_order = {key: seqs for key, seqs in sink.first_seen().items() if seqs != sorted(seqs)}
    first = {}
    for item in sink.items:
        first.setdefault(item.n, item)
    # Latency of what was published while the migration ran.
    during = [
        first[n].handled_at - first[n].published_at
        for n, at in traffic.sent_at.items()
        if at >= switch and n in first
    ]
    report(f"order[{ordering}].keys_out_of_order", len(out_of_order))
    report(f"order[{ordering}].max_latency_after_switch_s", round(max(during), 3))
    report(f"order[{ordering}].duplicates", duplicates(sink))
    one_processor_per_shard(sink)
    if ordering == "key":
        assert not out_of_order, out_of_order


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_scale_in_completes_with_a_poison_entry_on_a_removed_shard(
    coord: CoordinatorProcess,
    any_redis: RedisTarget,
    admin: Admin,
    r: AsyncRedisClient,
    prefix: str,
) -> None:
    """A removed shard stays assigned until it is proven drained; its poison
    entry is retried, dead-lettered and acked, so the proof passes and the
    scale-in completes."""
    await admin.create_group(prefix, "g", 4)
    tries: list[int] = []
    handled: list[str] = []
    app = StreamKit(**client_settings(coord, any_redis, "poisoned"))

    @app.stream_listener(
        stream_prefix=prefix,
        group="g",
        failure_policy=FailurePolicy(max_attempts=4, backoff_initial_ms=400, jitter=0.0),
    )
    async def handle(msg: Message) -> None:
        if "poison" in msg.fields:
            tries.append(msg.attempt)
            raise RuntimeError("poison")
        handled.append(f"{msg.stream_key}/{msg.id}")
        await msg.ack()

    removed = f"{prefix}:3"
    published = [f"{prefix}:{s}/{await r.xadd(f'{prefix}:{s}', {'n': str(s)})}" for s in range(4)]
    poison = await r.xadd(removed, {"poison": "1"})
    published.append(f"{removed}/{await r.xadd(removed, {'n': 'after'})}")
    async with serving(app):
        await settled(admin, prefix, "g", 1, 4)
        await eventually(lambda: _true(tries == [1]), 10, "the first attempt")
        rid = await admin.scale_ok(prefix, 3)
        await admin.wait_state(prefix, ["g"], rid, "DEPRECATED", within=20)
    assert tries == [1, 2, 3, 4]
    assert await r.exists(removed) == 0
    assert sorted(handled) == sorted(published)
    ((_, letter),) = await r.xrange(f"{prefix}/dlq/g")
    assert letter["x-original-stream"] == removed and letter["x-original-id"] == poison
    assert letter["x-attempts"] == "4"
