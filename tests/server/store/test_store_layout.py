"""Layout v2 in the store itself: two processes' parse caches on one Redis.

Two ``MetadataStore`` instances stand for two coordinator processes.  Each
must see exactly what the other wrote: member-only writes arrive as a delta
(only the records the write log names), anything else or a restored snapshot
as a full read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamkit.testing import RedisTarget, redis_client
from streamkit_server.core import GroupDocumentChanged, MemberMetadata, MemberUpserted, new_group
from streamkit_server.observability.metrics import Metrics
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.metadata import MetadataStore
from streamkit_server.store.records import CommitResult, Loaded, MutexBusy

from ..sim import KEY_PREFIX


@pytest.fixture
async def stores(any_redis: RedisTarget) -> AsyncIterator[tuple[MetadataStore, MetadataStore]]:
    a, b = redis_client(any_redis), redis_client(any_redis)
    try:
        yield MetadataStore(a, KEY_PREFIX, Metrics()), MetadataStore(b, KEY_PREFIX, Metrics())
    finally:
        await a.aclose()
        await b.aclose()


async def _write(store: MetadataStore, loaded: Loaded, member: MemberMetadata) -> Loaded:
    group = loaded.group.model_copy(
        update={"members": {**loaded.group.members, member.member_id: member}}
    )
    written = await store.commit(loaded, loaded.keys, group, (MemberUpserted(member),), "")
    assert written.ok and written.loaded is not None
    return written.loaded


async def _create(store: MetadataStore, prefix: str) -> tuple[GroupKeys, Loaded]:
    """Group g of ``prefix`` on 4 shards, created by ``store``: its keys and what it wrote."""
    keys = store.group_keys(prefix, "g")
    created = await store.commit(None, keys, new_group(prefix, "g", 4, 1), (), "")
    assert created.ok and created.loaded is not None
    return keys, created.loaded


async def _load(store: MetadataStore, keys: GroupKeys) -> Loaded:
    loaded = await store.load(keys)
    assert loaded is not None
    return loaded


async def test_member_writes_of_one_process_reach_the_other_as_deltas(
    stores: tuple[MetadataStore, MetadataStore],
) -> None:
    a, b = stores
    keys, mine = await _create(a, "layout")
    seen_by_b = await _load(b, keys)
    for n in range(5):
        mine = await _write(a, mine, MemberMetadata(member_id=f"m{n}", last_heartbeat_ms=n))
        previous = seen_by_b.group.members
        seen_by_b = await _load(b, keys)
        assert seen_by_b.revision == mine.revision
        assert seen_by_b.group == mine.group
        # A delta: the records b had are kept as they were, not parsed again.
        assert all(seen_by_b.group.members[m] is record for m, record in previous.items())
    # b writes on top of a's member writes; a catches up in turn.
    theirs = await _write(b, seen_by_b, MemberMetadata(member_id="m0", last_heartbeat_ms=99))
    assert (await _load(a, keys)).group == theirs.group
    # A member-only write sends only the record: the document is untouched.
    before = await a.client.hget(keys.metadata, "group")
    await _write(a, await _load(a, keys), MemberMetadata(member_id="m1", last_heartbeat_ms=7))
    assert await a.client.hget(keys.metadata, "group") == before


async def test_a_restored_copy_with_the_same_revision_is_read_again_in_full(
    stores: tuple[MetadataStore, MetadataStore],
) -> None:
    a, b = stores
    keys, created = await _create(a, "restore")
    base = await _write(a, created, MemberMetadata(member_id="m1"))
    snapshot = await a.client.hgetall(keys.metadata)
    # a writes revision N+1; Redis then goes back to N and another process
    # writes a different N+1 (a document change: a new shard count).
    ahead = await _write(a, base, MemberMetadata(member_id="m2"))
    await b.client.delete(keys.metadata)
    await b.client.hset(keys.metadata, mapping=snapshot)
    other = base.group.model_copy(update={"shard_count": 5, "layout": [0, 1, 2, 3, 4]})
    rewritten = await b.commit(await _load(b, keys), keys, other, (GroupDocumentChanged(),), "")
    assert rewritten.ok and rewritten.revision == ahead.revision
    # Same revision number as a's cached copy, other contents: a must not trust its cache.
    reloaded = await _load(a, keys)
    assert reloaded.group.shard_count == 5
    assert set(reloaded.group.members) == {"m1"}


async def test_a_steady_write_is_one_round_trip_unless_its_own_record_or_the_document_moved(
    stores: tuple[MetadataStore, MetadataStore],
) -> None:
    a, b = stores
    keys, created = await _create(a, "steady")
    mine = await _write(a, created, MemberMetadata(member_id="m1"))
    seen_by_b = await _load(b, keys)

    def with_member(loaded: Loaded, member: MemberMetadata) -> tuple[Any, tuple[MemberUpserted]]:
        members = {**loaded.group.members, member.member_id: member}
        return loaded.group.model_copy(update={"members": members}), (MemberUpserted(member),)

    # Current copy, free mutex: written, no mutex left behind.
    group, changes = with_member(mine, MemberMetadata(member_id="m1", last_heartbeat_ms=5))
    done = await a.commit_steady(mine, group, changes, "tok-a", 10_000)
    assert isinstance(done, CommitResult) and done.ok and done.revision == mine.revision + 1
    assert await a.client.exists(keys.mutex) == 0
    assert (await _load(b, keys)).group.members["m1"].last_heartbeat_ms == 5
    # b's copy missed a's write of m1 only: b's write of m2 still goes through
    # in one round trip and brings m1's record back.
    group, changes = with_member(seen_by_b, MemberMetadata(member_id="m2"))
    caught_up = await b.commit_steady(seen_by_b, group, changes, "tok-b", 10_000)
    assert isinstance(caught_up, CommitResult) and caught_up.revision == done.revision + 1
    assert caught_up.loaded is not None and caught_up.loaded == await _full(b, keys)
    assert caught_up.loaded.group.members["m1"].last_heartbeat_ms == 5
    assert await b.client.exists(keys.mutex) == 0
    # a's copy missed b's write of m2; a write of m2 itself does not go
    # through: nothing written, the mutex taken and the group read instead.
    assert done.loaded is not None
    group, changes = with_member(done.loaded, MemberMetadata(member_id="m2", last_heartbeat_ms=9))
    fallback = await a.commit_steady(done.loaded, group, changes, "tok-a2", 10_000)
    assert isinstance(fallback, Loaded) and fallback.revision == caught_up.revision
    assert fallback.group.members["m2"].last_heartbeat_ms == 0
    assert await a.client.get(keys.mutex) in (b"tok-a2", "tok-a2")
    # While a holds the mutex, b's current copy is not written either: busy.
    group, changes = with_member(caught_up.loaded, MemberMetadata(member_id="m3"))
    with pytest.raises(MutexBusy):
        await b.commit_steady(caught_up.loaded, group, changes, "tok-b2", 10_000)
    assert "m3" not in (await _load(b, keys)).group.members
    # A document write since the copy: the copy is not caught up, read again.
    other = fallback.group.model_copy(update={"shard_count": 5, "layout": [0, 1, 2, 3, 4]})
    moved = await a.commit(fallback, keys, other, (GroupDocumentChanged(),), "tok-a2")
    assert moved.ok
    group, changes = with_member(caught_up.loaded, MemberMetadata(member_id="m3"))
    reread = await b.commit_steady(caught_up.loaded, group, changes, "tok-b3", 10_000)
    assert isinstance(reread, Loaded) and reread.group.shard_count == 5
    await b.release(keys.mutex, "tok-b3")


async def _full(store: MetadataStore, keys: GroupKeys) -> Loaded:
    """The group read in full by a store that had no copy (no delta can hide anything)."""
    fresh = MetadataStore(store.client, KEY_PREFIX, Metrics())
    return await _load(fresh, keys)
