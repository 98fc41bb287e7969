"""Retention rules (core/retention.py): never past what a group still needs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamkit_server.core.errors import Rejected
from streamkit_server.core.retention import (
    GroupPosition,
    RetentionPolicy,
    group_floor,
    parse_id,
    plan_trim,
)

ids = st.tuples(st.integers(0, 10_000), st.integers(0, 5))
positions = st.builds(GroupPosition, st.sampled_from(["a", "b", "c"]), ids, st.none() | ids)
policies = st.builds(
    RetentionPolicy, st.none() | st.integers(1, 10_000), st.none() | st.integers(1, 50)
)


@given(st.lists(positions, max_size=4))
def test_the_floor_is_what_every_group_still_needs(groups: list[GroupPosition]) -> None:
    floor, holder = group_floor(groups)
    if not groups:
        assert (floor, holder) == (None, None)
        return
    assert floor is not None
    for g in groups:
        # Its last delivered entry and every pending one are at or above the floor.
        assert floor <= g.last_delivered
        assert g.pending_min is None or floor <= g.pending_min
    held = [g for g in groups if g.name == holder]
    assert any(floor in (g.last_delivered, g.pending_min) for g in held)


@given(policies, st.integers(0, 20_000), st.none() | ids, st.lists(positions, max_size=3))
def test_a_plan_never_trims_past_the_floor(
    policy: RetentionPolicy,
    now: int,
    length_cutoff: tuple[int, int] | None,
    groups: list[GroupPosition],
) -> None:
    floor, holder = group_floor(groups)
    plan = plan_trim(policy, now, length_cutoff, floor, holder)
    if plan.min_id is not None and floor is not None:
        assert plan.min_id <= floor
    if plan.wanted is None:
        assert plan.min_id is None and not plan.blocked
        return
    # The more trimming of the two rules.
    rules = []
    if policy.max_age_ms is not None:
        rules.append((max(0, now - policy.max_age_ms), 0))
    if policy.max_length is not None and length_cutoff is not None:
        rules.append(length_cutoff)
    assert plan.wanted == max(rules)
    assert plan.blocked == (floor is not None and floor < plan.wanted)
    assert plan.min_id == (floor if plan.blocked else plan.wanted)
    assert (plan.blocking_group is not None) == plan.blocked


def test_a_coordinator_group_missing_on_a_shard_blocks_everything() -> None:
    present = [GroupPosition("a", (50, 0))]
    assert group_floor(present, expected=["a", "b"]) == ((0, 0), "b")
    # ... unless the shard is empty: there is nothing it could have missed.
    assert group_floor(present, expected=["a", "b"], empty=True) == ((50, 0), "a")


def test_a_blocked_plan_says_by_whom() -> None:
    week = RetentionPolicy(max_age_ms=1000)
    plan = plan_trim(week, 5000, None, (1500, 3), "slow")
    assert plan.wanted == (4000, 0) and plan.min_id == (1500, 3)
    assert plan.blocked and plan.blocking_group == "slow"
    free = plan_trim(week, 5000, None, (4500, 0), "fast")
    assert free.min_id == (4000, 0) and not free.blocked and free.blocking_group is None


def test_policy_bounds_and_field() -> None:
    with pytest.raises(Rejected):
        RetentionPolicy(max_age_ms=0)
    with pytest.raises(Rejected):
        RetentionPolicy(max_length=0)
    policy = RetentionPolicy(max_age_ms=604_800_000, max_length=1_000_000)
    assert RetentionPolicy.from_field(policy.to_field()) == policy
    assert RetentionPolicy.from_field("{}") == RetentionPolicy()
    assert not RetentionPolicy().enabled
    assert policy.describe() == "max age 7d, max length 1000000"
    for raw in ("[]", '{"maxAge": 1}', '{"maxLength": "3"}', '{"maxLength": true}'):
        with pytest.raises(ValueError):
            RetentionPolicy.from_field(raw)
    assert parse_id("17-3") == (17, 3) and parse_id("17") == (17, 0)
