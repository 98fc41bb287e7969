"""The per-group alert gauges, from metadata alone (no Redis)."""

from __future__ import annotations

from streamkit_server.core.model import MemberMetadata, MemberState, new_group
from streamkit_server.gauges import group_gauges


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
