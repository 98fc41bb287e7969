"""``MemberStateMachine.stop()``: a member shutting down starts nothing again.

The coordinator keeps a draining member's shards in its target assignment
until the member leaves, so OK answers during the shutdown drain still list
them; the machine must not resume reading them (``stopping`` guard).
"""

from __future__ import annotations

from streamkit.consumer.member import MemberStateMachine, ReactionKind
from streamkit.protocol import (
    AssignmentView,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatStatus,
    RevokingShardState,
    shard_ids,
    shard_indexes,
)


def ok(req: HeartbeatRequest, assigned: list[int], epoch: int = 3) -> HeartbeatResponse:
    return HeartbeatResponse(
        response_to=req.request_id,
        status=HeartbeatStatus.OK,
        member_id=req.member_id,
        member_epoch=epoch,
        heartbeat_interval_ms=100,
        metadata_version=4,
        assignment=AssignmentView(assigned_shards=shard_ids(assigned), metadata_version=4),
    )


def test_stop_drains_and_never_restarts() -> None:
    m = MemberStateMachine("m0", lease_ms=1_000)
    req = m.next_request(0)
    [start] = m.on_response(ok(req, [1, 2]))
    assert start.kind is ReactionKind.START

    assert m.stop() == frozenset({1, 2})
    assert m.stopping and m.reading == set() and m.draining == {1, 2}

    # Still assigned by the coordinator: no START, the shards keep draining.
    req = m.next_request(10)
    assert req.owned_shards == []
    assert {r.shard.shard_index for r in req.revoking_shards if r.shard} == {1, 2}
    assert m.on_response(ok(req, [1, 2])) == []
    assert m.reading == set() and not m.may_read(1, 20)

    m.drained(1)
    m.drained(2)
    req = m.next_request(30)
    assert [r.state for r in req.revoking_shards] == [RevokingShardState.REVOKED] * 2
    assert m.on_response(ok(req, [1, 2])) == []
    assert m.readable(40) == frozenset()

    leave = m.leave_request(50)
    assert leave.member_epoch == -1 and shard_indexes(leave.owned_shards) == []
