"""The resharding state machine in the pure core."""

from __future__ import annotations

import pytest

from streamkit.protocol import MigrationState
from streamkit_server.core import (
    ReshardingRejected,
    ReshardingSpec,
    new_group,
    pending_work,
    rollback_resharding,
    start_resharding,
)

from .harness import CONFIG, Harness, request

LEASE = CONFIG.producer_routing_lease_ms


def with_members(shards: int, members: list[str]) -> Harness:
    h = Harness(group=new_group("orders", "billing", shards, 0))
    for m in members:
        h.join(m)
    for _ in range(3):  # settle: everyone reads its share
        for m in members:
            mm = h.group.members[m]
            h.beat(
                m,
                request(
                    m,
                    mm.member_epoch,
                    owned=h.group.assigned_to(m),
                    version=h.group.metadata_version,
                ),
            )
    return h


def migrated(shards: int, members: list[str], to: int, *, ordered: bool = False) -> Harness:
    """``with_members(shards, members)``, then migration "r1" to ``to`` shards
    started and its provisioning completed."""
    h = with_members(shards, members)
    h.start(to, "r1", ordered=ordered)
    h.complete("r1")
    return h


def state(h: Harness) -> MigrationState:
    return h.group.migrations[-1].state


def settle(h: Harness, members: list[str]) -> None:
    """Members drain whatever they were told to give up and heartbeat."""
    for m in members:
        mm = h.group.members[m]
        if not mm.live:
            continue
        keep = h.group.assigned_to(m)
        gone = [s for s in h.group.shards_held_by(m) if s not in keep]
        h.beat(
            m,
            request(m, mm.member_epoch, owned=keep, revoked=gone, version=h.group.metadata_version),
        )


def scaled_in_to_2(drained: dict[int, bool]) -> Harness:
    """4 shards with member "a" scaled in to 2 ("r1"), the routing lease over,
    the removed shards probed (``drained``) and released: ready to retire."""
    h = migrated(4, ["a"], 2)
    h.advance(LEASE)
    h.tick()
    h.probed("r1", drained)
    settle(h, ["a"])
    return h


def test_scale_out_provisions_switches_routing_and_deprecates_after_producer_lease() -> None:
    h = with_members(4, ["a", "b"])
    h.start(8, "r1")
    assert state(h) is MigrationState.PREPARING and h.group.shard_count == 4
    work = pending_work(h.group, h.now, CONFIG)
    assert work is not None and work.provision == (4, 5, 6, 7)
    h.complete("r1")
    assert state(h) is MigrationState.ACTIVE and h.group.shard_count == 8
    for _ in range(3):
        settle(h, ["a", "b"])
    assert sorted(h.group.owners) == list(range(8))
    h.advance(LEASE - 1)
    h.tick()
    assert state(h) is MigrationState.ACTIVE
    h.advance(1)
    h.tick()
    assert state(h) is MigrationState.DEPRECATED


def test_scale_in_retires_removed_shards_only_after_drain_proof_and_release() -> None:
    h = migrated(8, ["a", "b", "c"], 3)
    assert h.group.shard_count == 3 and h.group.draining_shards == [3, 4, 5, 6, 7]
    # Removed shards stay assigned so their backlog is consumed.
    settle(h, ["a", "b", "c"])
    assert set(h.group.owners) == set(range(8))
    assert pending_work(h.group, h.now, CONFIG) is None  # producers may still write there
    h.advance(LEASE)
    h.tick()
    assert state(h) is MigrationState.DRAINING
    work = pending_work(h.group, h.now, CONFIG)
    assert work is not None and work.probe == (3, 4, 5, 6, 7) and work.retire == ()
    # Shard 7 still has lag: only the others are proven.
    h.probed("r1", {3: True, 4: True, 5: True, 6: True, 7: False})
    assert h.group.draining_shards == [7]
    work = pending_work(h.group, h.now, CONFIG)
    assert work is not None and work.retire == ()  # still held: holders must revoke first
    settle(h, ["a", "b", "c"])
    work = pending_work(h.group, h.now, CONFIG)
    assert work is not None and work.retire == (3, 4, 5, 6) and work.probe == (7,)
    h.retired("r1", {3: True, 4: True, 5: True, 6: True})
    assert state(h) is MigrationState.DRAINING
    h.probed("r1", {7: True})
    settle(h, ["a", "b", "c"])
    h.retired("r1", {7: True})
    assert state(h) is MigrationState.DEPRECATED
    assert set(h.group.target) == {0, 1, 2}


def test_failed_retirement_makes_the_shard_assignable_again() -> None:
    h = scaled_in_to_2({2: True, 3: True})
    h.retired("r1", {2: True, 3: False})
    assert h.group.draining_shards == [3] and 3 in h.group.target
    assert state(h) is MigrationState.DRAINING


def test_scale_in_with_every_member_expired_needs_only_the_redis_drain_proof() -> None:
    h = migrated(4, ["a", "b"], 2)
    h.advance(max(LEASE, CONFIG.member_lease_ttl_ms + 1))
    h.tick()
    assert h.group.owners == {} and state(h) is MigrationState.DRAINING
    h.probed("r1", {2: True, 3: True})
    work = pending_work(h.group, h.now, CONFIG)
    assert work is not None and work.retire == (2, 3)
    h.retired("r1", {2: True, 3: True})
    assert state(h) is MigrationState.DEPRECATED


def test_scale_to_zero_routes_nothing_and_drains_everything() -> None:
    h = migrated(3, ["a"], 0)
    assert h.group.shard_count == 0 and h.group.draining_shards == [0, 1, 2]
    assert set(h.group.target) == {0, 1, 2}  # still read until drained


def _spec(target: int, rid: str) -> ReshardingSpec:
    return ReshardingSpec(resharding_id=rid, target_shard_count=target)


def test_one_active_migration_at_a_time_and_bad_targets_are_rejected() -> None:
    h = with_members(4, ["a"])
    with pytest.raises(ReshardingRejected) as same:
        start_resharding(h.group, _spec(4, "x"), h.now)
    assert same.value.error_code == "SHARD_COUNT_UNCHANGED"
    with pytest.raises(ReshardingRejected) as negative:
        start_resharding(h.group, _spec(-1, "x"), h.now)
    assert negative.value.error_code == "INVALID_TARGET_SHARD_COUNT"
    h.start(6, "r1")
    with pytest.raises(ReshardingRejected) as busy:
        start_resharding(h.group, _spec(8, "r2"), h.now)
    assert busy.value.error_code == "ACTIVE_MIGRATION_EXISTS"


def test_failed_provisioning_routes_nothing() -> None:
    h = with_members(4, ["a"])
    h.start(6, "r1")
    h.fail("r1")
    assert state(h) is MigrationState.ROLLED_BACK and h.group.shard_count == 4


def test_rollback_while_allowed_drains_the_added_shards() -> None:
    h = migrated(4, ["a"], 6)
    h.rollback("r1")
    assert state(h) is MigrationState.ROLLING_BACK
    assert h.group.shard_count == 4 and h.group.draining_shards == [4, 5]
    h.advance(LEASE)
    h.tick()
    h.probed("r1", {4: True, 5: True})
    settle(h, ["a"])
    h.retired("r1", {4: True, 5: True})
    assert state(h) is MigrationState.ROLLED_BACK


def test_rollback_of_scale_in_reinstates_removed_shards() -> None:
    h = migrated(4, ["a"], 2)
    h.rollback("r1")
    assert h.group.shard_count == 4 and h.group.draining_shards == []
    assert state(h) is MigrationState.ROLLED_BACK


def test_rollback_refused_once_a_shard_is_retired() -> None:
    h = scaled_in_to_2({2: True})
    h.retired("r1", {2: True})
    with pytest.raises(ReshardingRejected) as refused:
        rollback_resharding(h.group, "r1", h.now, CONFIG)
    assert refused.value.error_code == "ROLLBACK_NOT_ALLOWED"


def test_ordered_reshard_reads_children_only_after_every_parent_is_retired() -> None:
    h = with_members(4, ["a", "b"])
    h.start(8, "r1", ordered=True)
    work = pending_work(h.group, h.now, CONFIG)
    assert work is not None and work.provision == tuple(range(4, 12))
    h.complete("r1")
    # Producers write to the children at once...
    assert h.group.layout == list(range(4, 12)) and h.group.shard_count == 8
    # ...but consumers keep reading only the parents.
    assert h.group.held_shards == list(range(4, 12))
    settle(h, ["a", "b"])
    assert set(h.group.owners) == {0, 1, 2, 3}
    h.advance(LEASE)
    h.tick()
    h.probed("r1", dict.fromkeys(range(4), True))
    settle(h, ["a", "b"])
    assert h.group.owners == {} and h.group.held_shards == list(range(4, 12))
    h.retired("r1", dict.fromkeys(range(3), True))
    assert h.group.held_shards == list(range(4, 12))  # one parent is still there
    h.retired("r1", {3: True})
    assert state(h) is MigrationState.DEPRECATED and h.group.held_shards == []
    for _ in range(2):
        settle(h, ["a", "b"])
    assert set(h.group.owners) == set(range(4, 12))


def test_plain_reshard_reuses_free_shard_numbers_to_keep_the_identity_layout() -> None:
    h = scaled_in_to_2({2: True, 3: True})
    h.retired("r1", {2: True, 3: True})
    h.start(5, "r2")
    assert h.group.migrations[-1].added_shards == [2, 3, 4]
    h.complete("r2")
    assert h.group.layout == [0, 1, 2, 3, 4]


def test_rollback_of_an_ordered_reshard_restores_the_parents() -> None:
    h = migrated(2, ["a"], 3, ordered=True)
    assert h.group.layout == [2, 3, 4]
    h.rollback("r1")
    assert h.group.layout == [0, 1] and h.group.held_shards == []
    assert h.group.draining_shards == [2, 3, 4]
    assert state(h) is MigrationState.ROLLING_BACK
