"""The sticky balanced assignor: balance, stickiness, minimal movement."""

from __future__ import annotations

import math

import hypothesis.strategies as st
from hypothesis import given

from streamkit_server.core import assign, moved_count

members_st = st.lists(
    st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=12, unique=True
)


@given(shards=st.integers(0, 200), members=members_st)
def test_result_is_complete_and_balanced(shards: int, members: list[str]) -> None:
    result = assign(range(shards), members, {})
    assert sorted(result) == list(range(shards))
    counts = [sum(1 for m in result.values() if m == member) for member in members]
    assert max(counts) - min(counts) <= 1


@given(shards=st.integers(1, 300), before=st.integers(1, 30))
def test_one_member_joining_moves_exactly_the_minimum(shards: int, before: int) -> None:
    members = [f"m{i:02d}" for i in range(before)]
    balanced = assign(range(shards), members, {})
    after = assign(range(shards), [*members, "new"], balanced)
    newcomer = sum(1 for m in after.values() if m == "new")
    # The newcomer ends with floor or ceil of S/(M+1) shards, and every one of
    # them is the only move: nobody else's shards are shuffled.
    assert newcomer in (shards // (before + 1), math.ceil(shards / (before + 1)))
    assert moved_count(balanced, after) == newcomer
    counts = [sum(1 for m in after.values() if m == member) for member in [*members, "new"]]
    assert max(counts) - min(counts) <= 1


@given(shards=st.integers(1, 300), before=st.integers(2, 30), data=st.data())
def test_one_member_leaving_moves_only_its_shards(
    shards: int, before: int, data: st.DataObject
) -> None:
    members = [f"m{i:02d}" for i in range(before)]
    balanced = assign(range(shards), members, {})
    leaver = data.draw(st.sampled_from(members))
    after = assign(range(shards), [m for m in members if m != leaver], balanced)
    orphaned = sum(1 for m in balanced.values() if m == leaver)
    assert moved_count(balanced, after) == orphaned


@given(shards=st.integers(0, 100), members=members_st, prev_members=members_st, data=st.data())
def test_any_previous_target_converges_to_balance_keeping_fair_shares(
    shards: int, members: list[str], prev_members: list[str], data: st.DataObject
) -> None:
    previous = {
        s: data.draw(st.sampled_from(prev_members))
        for s in range(shards)
        if data.draw(st.booleans())
    }
    result = assign(range(shards), members, previous)
    counts = {m: sum(1 for x in result.values() if x == m) for m in members}
    assert max(counts.values()) - min(counts.values()) <= 1
    # A live member never loses a shard while it holds no more than its floor share.
    floor = shards // len(members)
    for member in members:
        kept = [s for s, m in previous.items() if m == member]
        if len(kept) <= floor:
            assert all(result[s] == member for s in kept)


def test_no_members_means_no_target() -> None:
    assert assign(range(4), [], {0: "a"}) == {}
