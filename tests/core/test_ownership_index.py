"""The per-member ownership index answers exactly what a scan of the maps would.

``GroupMetadata`` answers "which shards does this member hold / target" from an
index it keeps across copies, so a steady heartbeat does not scan the group.
The index must never go stale: not when a ``Draft`` writes its own copy of
``owners`` in place, not when a map is replaced, and never for the group the
draft was made from (which shares the index until the draft writes).
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from streamkit_server.core import CoordinatorConfig, GroupMetadata, new_group
from streamkit_server.core.draft import Draft

MEMBERS = ["a", "b", "c", "d"]
SHARDS = 12

shard_map = st.dictionaries(st.integers(0, SHARDS - 1), st.sampled_from(MEMBERS), max_size=SHARDS)


def _scan(group: GroupMetadata, member: str) -> dict[str, list[int]]:
    owners, target = group.owners, group.target
    return {
        "held": sorted(s for s, m in owners.items() if m == member),
        "assigned": sorted(s for s, m in owners.items() if m == member and target.get(s) == m),
        "revoking": sorted(s for s, m in owners.items() if m == member and target.get(s) != m),
        "pending": sorted(s for s, m in target.items() if m == member and owners.get(s) != m),
    }


def _indexed(group: GroupMetadata, member: str) -> dict[str, list[int]]:
    return {
        "held": group.shards_held_by(member),
        "assigned": group.assigned_to(member),
        "revoking": group.revoking_from(member),
        "pending": group.pending_for(member),
    }


def _check(group: GroupMetadata) -> None:
    for member in [*MEMBERS, "nobody"]:
        assert _indexed(group, member) == _scan(group, member)


steps = st.lists(
    st.one_of(
        st.tuples(st.just("release"), st.integers(0, SHARDS - 1)),
        st.tuples(st.just("grant"), st.sampled_from(MEMBERS)),
        st.tuples(st.just("retarget"), shard_map),
        st.tuples(st.just("replace_owners"), shard_map),
        st.tuples(st.just("finish"), st.none()),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(owners=shard_map, target=shard_map, steps=steps)
def test_index_matches_a_scan_through_draft_writes(
    owners: dict[int, str], target: dict[int, str], steps: list[tuple[str, object]]
) -> None:
    group = new_group("s", "g", SHARDS, 0).model_copy(update={"owners": owners, "target": target})
    _check(group)  # builds the index the drafts below start from
    draft = Draft(group, 1, CoordinatorConfig())
    for step, arg in steps:
        before = {m: _scan(group, m) for m in MEMBERS}
        if step == "release":
            assert isinstance(arg, int)
            draft.release(arg)
        elif step == "grant":
            assert isinstance(arg, str)
            draft.grant_pending(arg)
        elif step == "retarget":
            assert isinstance(arg, dict)
            draft.group.target = dict(arg)
        elif step == "replace_owners":
            assert isinstance(arg, dict)
            draft.group = draft.group.model_copy(update={"owners": dict(arg)})
        else:
            group = draft.finish()
            draft = Draft(group, 1, CoordinatorConfig())
            before = {m: _scan(group, m) for m in MEMBERS}
        _check(draft.group)
        # The draft's writes never reach the group it was made from.
        assert {m: _scan(group, m) for m in MEMBERS} == before
        _check(group)


def test_equal_groups_stay_equal_whether_or_not_indexed() -> None:
    one = new_group("s", "g", 4, 0).model_copy(update={"owners": {0: "a"}, "target": {0: "a"}})
    other = GroupMetadata.model_validate(one.model_dump())
    one.shards_held_by("a")
    assert one == other
    assert one != other.model_copy(update={"owners": {0: "b"}})
