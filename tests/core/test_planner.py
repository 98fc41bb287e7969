"""The stream-wide resharding planner over plain values (no Redis)."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given

from streamkit.protocol import MigrationState
from streamkit_server.core import (
    GroupMetadata,
    ReshardingSpec,
    complete_provisioning,
    new_group,
    start_resharding,
    tick,
)
from streamkit_server.core.errors import Rejected
from streamkit_server.core.planner import (
    active_migrations,
    added_shards,
    participants,
    plan_drain,
    plan_provisioning,
    refuse_active,
)

from .harness import CONFIG

LEASE = CONFIG.producer_routing_lease_ms
REMOVED = (3, 4, 5, 6, 7)


def _state(result: object) -> GroupMetadata:
    state = getattr(result, "state", None)
    assert isinstance(state, GroupMetadata)
    return state


def preparing(name: str, shards: int = 8, target: int = 3) -> GroupMetadata:
    group = new_group("orders", name, shards, 0)
    spec = ReshardingSpec(resharding_id="r1", target_shard_count=target)
    return _state(start_resharding(group, spec, 0, CONFIG))


def draining(name: str) -> GroupMetadata:
    """A group of an 8 -> 3 scale-in whose producer lease has run out."""
    group = _state(complete_provisioning(preparing(name), "r1", 0, CONFIG))
    group = _state(tick(group, LEASE, CONFIG))
    migration = group.active_migration()
    assert migration is not None and migration.state is MigrationState.DRAINING
    return group


def with_progress(
    group: GroupMetadata, proven: set[int], held: set[int], retired: set[int]
) -> GroupMetadata:
    """``group`` after some shards were proven, some are held and some retired."""
    migration = group.active_migration()
    assert migration is not None
    migration = migration.model_copy(update={"retired_shards": sorted(retired)})
    return group.model_copy(
        update={
            "draining_shards": sorted(set(REMOVED) - proven - retired),
            "owners": dict.fromkeys(sorted(held - retired), "m"),
            "migrations": [*group.migrations[:-1], migration],
        }
    )


def test_nothing_is_probed_until_every_groups_producer_lease_ran_out() -> None:
    late = _state(complete_provisioning(preparing("late"), "r1", LEASE // 2, CONFIG))
    groups = {"early": draining("early"), "late": late}
    assert plan_drain("r1", groups, LEASE, CONFIG) is None
    late = _state(tick(late, LEASE // 2 + LEASE, CONFIG))
    plan = plan_drain("r1", {**groups, "late": late}, LEASE // 2 + LEASE, CONFIG)
    assert plan is not None and plan.probe == REMOVED and plan.retire == ()


def test_probe_results_go_to_the_groups_that_asked_and_only_when_something_is_proven() -> None:
    groups = {"a": draining("a"), "b": with_progress(draining("b"), {3, 4, 5, 6, 7}, set(), set())}
    plan = plan_drain("r1", groups, LEASE, CONFIG)
    assert plan is not None
    assert dict(plan.probing) == {"a": REMOVED}
    assert plan.probe_results(dict.fromkeys(REMOVED, False)) == {}
    assert plan.probe_results({3: True}) == {"a": {3: True, 4: False, 5: False, 6: False, 7: False}}


def test_a_shard_one_group_still_holds_is_not_retired_for_any_group() -> None:
    a = with_progress(draining("a"), {3, 4}, set(), set())
    b = with_progress(draining("b"), {3, 4}, {4}, set())
    plan = plan_drain("r1", {"a": a, "b": b}, LEASE, CONFIG)
    assert plan is not None and plan.retire == (3,)
    outcome = plan.retirement_results({3: True})
    assert outcome == {"a": {3: True}, "b": {3: True}}


def test_provisioning_plan_names_the_agreed_shards_and_the_groups_to_switch() -> None:
    groups = {"a": preparing("a", 4, 6), "b": preparing("b", 4, 6)}
    plan = plan_provisioning("orders", "r1", groups, 0, CONFIG)
    assert plan is not None and plan.shards == (4, 5) and plan.complete == ("a", "b")
    assert added_shards("orders", "r1", groups.values()) == [4, 5]
    switched = {"a": draining("a")}
    assert plan_provisioning("orders", "r1", switched, LEASE, CONFIG) is None


def test_groups_that_would_add_different_shards_are_refused() -> None:
    groups = {"a": preparing("a", 4, 6), "b": preparing("b", 4, 7)}
    with pytest.raises(Rejected) as diverged:
        plan_provisioning("orders", "r1", groups, 0, CONFIG)
    assert diverged.value.error_code == "LAYOUT_DIVERGED"


def test_active_migrations_and_participants_and_the_start_refusal() -> None:
    idle = new_group("orders", "idle", 4, 0)
    groups = {"a": preparing("a"), "idle": idle}
    assert active_migrations(groups.values()) == ["r1"]
    assert list(participants(groups, "r1")) == ["a"]
    refuse_active("orders", [idle])
    with pytest.raises(Rejected) as busy:
        refuse_active("orders", groups.values())
    assert busy.value.error_code == "ACTIVE_MIGRATION_EXISTS"


shard_sets = st.sets(st.sampled_from(REMOVED))
progress = st.tuples(shard_sets, shard_sets, shard_sets)


def _retired(group: GroupMetadata) -> set[int]:
    migration = group.active_migration()
    assert migration is not None
    return set(migration.retired_shards)


@given(st.lists(progress, min_size=1, max_size=4))
def test_retire_exactly_what_every_group_agrees_is_proven_and_unheld(
    states: list[tuple[set[int], set[int], set[int]]],
) -> None:
    groups = {
        f"g{i}": with_progress(draining(f"g{i}"), proven, held, retired)
        for i, (proven, held, retired) in enumerate(states)
    }

    def agrees(group: GroupMetadata, shard: int) -> bool:
        if shard in _retired(group):
            return True  # already gone there: no objection
        return shard not in group.draining_shards and shard not in group.owners

    unretired = {s for g in groups.values() for s in REMOVED if s not in _retired(g)}
    expected = {s for s in unretired if all(agrees(g, s) for g in groups.values())}
    probe = {s for g in groups.values() for s in g.draining_shards}
    plan = plan_drain("r1", groups, LEASE, CONFIG)
    if plan is None:
        assert not probe and not expected
        return
    assert plan.probe == tuple(sorted(probe))
    assert set(plan.retire) == expected
    outcome = plan.retirement_results(dict.fromkeys(plan.retire, True))
    for name, group in groups.items():
        # Every group that still has a retired shard records its retirement.
        assert set(outcome.get(name, {})) == expected - _retired(group)
