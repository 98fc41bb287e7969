"""Steady writes of two processes on one group, against a model of the write log.

Two ``MetadataStore`` instances stand for two coordinator processes; each
keeps its own parsed copy and writes member records from it, interleaved with
document writes and read-only refreshes in an order Hypothesis draws.  The
model keeps, per revision, whether the write touched the document and which
member records it wrote, and predicts each steady write: one round trip when
the copy is current, or behind only by member-only writes of *other* records
that the write log still holds; otherwise the locked path (mutex taken, group
read).  After a one-round-trip write the writer's copy must be exactly what
Redis holds, and no write may be lost.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamkit_server.store.metadata as store_module
from streamkit.testing import RedisTarget, redis_client
from streamkit_server.core import GroupDocumentChanged, MemberMetadata, MemberUpserted, new_group
from streamkit_server.observability.metrics import Metrics
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.metadata import MetadataStore
from streamkit_server.store.records import CommitResult, Loaded

from ..sim import KEY_PREFIX

#: A short write log, so that copies fall out of it within a few steps.
LOG_SIZE = 4
MEMBERS = ("m0", "m1", "m2")

actions = st.lists(
    st.tuples(
        st.integers(0, 1),  # which process
        st.sampled_from(["steady"] * 4 + ["document", "refresh"]),
        st.sampled_from(MEMBERS),
    ),
    min_size=1,
    max_size=24,
)


@dataclass
class Model:
    #: revision -> (wrote the document, member records written)
    log: dict[int, tuple[bool, frozenset[str]]] = field(default_factory=dict)
    #: member -> the last_heartbeat_ms of its last record written
    last: dict[str, int] = field(default_factory=dict)

    def one_round_trip(self, copy: int, current: int, member: str) -> bool:
        if copy == current:
            return True
        if current - copy >= LOG_SIZE:
            return False  # the log no longer reaches back to the copy
        later = [self.log[r] for r in range(copy + 1, current + 1)]
        return all(not document and member not in ids for document, ids in later)


def _with(loaded: Loaded, member: MemberMetadata) -> Loaded:
    members = {**loaded.group.members, member.member_id: member}
    group = loaded.group.model_copy(update={"members": members})
    return Loaded(loaded.keys, loaded.revision, loaded.write_id, loaded.updated_at, group)


async def _full(client: object, keys: GroupKeys) -> Loaded:
    """The group as a store without any copy reads it (in full)."""
    loaded = await MetadataStore(client, KEY_PREFIX, Metrics()).load(keys)  # type: ignore[arg-type]
    assert loaded is not None
    return loaded


async def _scenario(target: RedisTarget, steps: list[tuple[int, str, str]]) -> None:
    clients = [redis_client(target), redis_client(target)]
    stores = [MetadataStore(c, KEY_PREFIX, Metrics()) for c in clients]
    try:
        keys = stores[0].group_keys("catch-up", uuid.uuid4().hex[:8])
        created = await stores[0].commit(None, keys, new_group("catch-up", "g", 4, 1), (), "")
        assert created.loaded is not None
        model = Model({created.loaded.revision: (True, frozenset())})
        copies = [created.loaded, await stores[1].load(keys)]
        beat = 0
        for who, kind, member_id in steps:
            store, copy = stores[who], copies[who]
            assert copy is not None
            current = max(model.log)
            token = f"tok-{uuid.uuid4().hex[:8]}"
            if kind == "refresh":
                copies[who] = await store.load(keys)
                continue
            if kind == "document":
                locked = await store.load(keys, token, 10_000)
                assert locked is not None
                epoch = locked.group.group_epoch + 1
                moved = locked.group.model_copy(update={"group_epoch": epoch})
                written = await store.commit(locked, keys, moved, (GroupDocumentChanged(),), token)
                assert written.ok and written.revision == current + 1
                model.log[current + 1] = (True, frozenset())
                copies[who] = written.loaded
                continue
            beat += 1
            member = MemberMetadata(member_id=member_id, last_heartbeat_ms=beat)
            wanted = _with(copy, member)
            changes = (MemberUpserted(member),)
            reply = await store.commit_steady(copy, wanted.group, changes, token, 10_000)
            if model.one_round_trip(copy.revision, current, member_id):
                assert isinstance(reply, CommitResult) and reply.revision == current + 1
                # The writer's copy is exactly what Redis holds now.
                assert reply.loaded == await _full(clients[0], keys)
                copies[who] = reply.loaded
            else:
                # Nothing written; the mutex is ours and the group was read: write under it.
                assert isinstance(reply, Loaded) and reply.revision == current
                assert reply == await _full(clients[0], keys)
                locked_write = _with(reply, member)
                written = await store.commit(reply, keys, locked_write.group, changes, token)
                assert written.ok and written.revision == current + 1
                copies[who] = written.loaded
            model.log[current + 1] = (False, frozenset({member_id}))
            model.last[member_id] = beat
        # No write lost: every member's record is the last one written for it.
        final = await _full(clients[0], keys)
        assert {m: r.last_heartbeat_ms for m, r in final.group.members.items()} == model.last
        assert final.revision == max(model.log)
        assert await clients[0].exists(keys.mutex) == 0
    finally:
        for client in clients:
            await client.aclose()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=actions)
def test_steady_writes_of_two_processes_follow_the_write_log(
    redis_url: str, steps: list[tuple[int, str, str]]
) -> None:
    with mock.patch.object(store_module, "WRITE_LOG_SIZE", LOG_SIZE):
        asyncio.run(_scenario(RedisTarget(url=redis_url, cluster=False), steps))
