"""The per-group alert gauges, from metadata alone (no Redis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamkit_server.core.model import GroupMetadata, MemberMetadata, MemberState, new_group
from streamkit_server.observability.gauges import group_gauges


def test_gauges_count_revokes_pending_shards_and_the_oldest_heartbeat() -> None:
    group = new_group("orders", "billing", 4, 0)
    members = {
        "a": MemberMetadata(member_id="a", state=MemberState.ACTIVE, last_heartbeat_ms=9_000),
        "b": MemberMetadata(member_id="b", state=MemberState.ACTIVE, last_heartbeat_ms=7_500),
        "gone": MemberMetadata(member_id="gone", state=MemberState.EXPIRED, last_heartbeat_ms=1),
    }
    # a holds 0, 1, 2; shards 1 and 2 now target b, which holds 3.
    group = group.model_copy(
        update={
            "members": members,
            "owners": {0: "a", 1: "a", 2: "a", 3: "b"},
            "target": {0: "a", 1: "b", 2: "b", 3: "b"},
        }
    )
    gauges = group_gauges(group, 10_000)
    assert gauges.heartbeat_age_seconds == 2.5  # b, the expired member does not count
    assert (gauges.revoke_pending, gauges.revoking_shards, gauges.pending_shards) == (1, 2, 2)
    settled = group.model_copy(update={"owners": {0: "a", 1: "b", 2: "b", 3: "b"}})
    assert group_gauges(settled, 10_000).revoke_pending == 0
    assert group_gauges(new_group("o", "g", 2, 0), 5_000).heartbeat_age_seconds == 0


_IDS = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def groups(draw: st.DrawFn) -> GroupMetadata:
    shards = draw(st.integers(0, 12))
    members = {
        m: MemberMetadata(
            member_id=m,
            state=draw(st.sampled_from(list(MemberState))),
            last_heartbeat_ms=draw(st.integers(0, 10_000)),
        )
        for m in draw(st.sets(_IDS))
    }
    # Owners and targets may name members that left (or never were): metadata
    # mid-reconciliation, as the tick loop finds it.
    owners = {s: o for s in range(shards) if (o := draw(st.none() | _IDS)) is not None}
    target = {s: t for s in range(shards) if (t := draw(st.none() | _IDS)) is not None}
    return new_group("o", "g", shards, 0).model_copy(
        update={"members": members, "owners": owners, "target": target}
    )


@given(groups())
def test_gauges_match_the_per_member_definitions(group: GroupMetadata) -> None:
    # The definitions the gauges document, member by member (the model's own
    # queries), against the one-pass computation.
    live = group.live_member_ids()
    revoking = {m: group.revoking_from(m) for m in live}
    gauges = group_gauges(group, 10_000)
    assert gauges.revoke_pending == sum(1 for shards in revoking.values() if shards)
    assert gauges.revoking_shards == sum(len(shards) for shards in revoking.values())
    assert gauges.pending_shards == sum(len(group.pending_for(m)) for m in live)
    oldest = min((group.members[m].last_heartbeat_ms for m in live), default=10_000)
    assert gauges.heartbeat_age_seconds == (10_000 - oldest) / 1000
