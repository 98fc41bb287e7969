"""The member-side state machine, rule by rule (SPEC §5, seed 004 "Contract")."""

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

LEASE = 1_000


def answer(
    req: HeartbeatRequest,
    status: HeartbeatStatus = HeartbeatStatus.OK,
    *,
    epoch: int = 5,
    assigned: list[int] | None = None,
    pending: list[int] | None = None,
    version: int = 10,
) -> HeartbeatResponse:
    return HeartbeatResponse(
        response_to=req.request_id,
        status=status,
        member_id=req.member_id,
        member_epoch=epoch,
        heartbeat_interval_ms=100,
        metadata_version=version,
        assignment=AssignmentView(
            assigned_shards=shard_ids(assigned or []),
            pending_shards=shard_ids(pending or []),
            metadata_version=version,
        ),
    )


def joined(assigned: list[int], now: int = 0) -> MemberStateMachine:
    m = MemberStateMachine("m0", lease_ms=LEASE)
    req = m.next_request(now)
    assert req.member_epoch == 0 and req.owned_shards == []
    m.on_response(answer(req, assigned=assigned))
    return m


def test_ok_assignment_starts_reading_under_a_lease_counted_from_sending() -> None:
    m = MemberStateMachine("m0", lease_ms=LEASE)
    req = m.next_request(100)
    reactions = m.on_response(answer(req, assigned=[1, 2]))
    assert [(r.kind, sorted(r.shards)) for r in reactions] == [(ReactionKind.START, [1, 2])]
    assert m.readable(100 + LEASE - 1) == {1, 2}
    assert m.readable(100 + LEASE) == frozenset()


def test_default_lease_is_two_heartbeat_intervals() -> None:
    m = MemberStateMachine("m0")
    req = m.next_request(0)
    m.on_response(answer(req, assigned=[1]))  # heartbeatIntervalMs = 100
    assert m.readable(199) == {1} and m.readable(200) == frozenset()


def test_shard_removed_from_assignment_is_drained_then_reported_revoked() -> None:
    m = joined([1, 2])
    req = m.next_request(10)
    reactions = m.on_response(answer(req, assigned=[1]))
    assert [(r.kind, set(r.shards)) for r in reactions] == [(ReactionKind.DRAIN, {2})]
    assert m.readable(10) == {1}
    draining = m.next_request(20, in_flight={2: 3})
    report = {r.shard.shard_index: r for r in draining.revoking_shards if r.shard}
    assert report[2].state is RevokingShardState.DRAINING and report[2].in_flight == 3
    assert shard_indexes(draining.owned_shards) == [1]
    m.request_failed()
    m.drained(2)
    done = m.next_request(30)
    report = {r.shard.shard_index: r for r in done.revoking_shards if r.shard}
    assert report[2].state is RevokingShardState.REVOKED and report[2].in_flight == 0
    m.on_response(answer(done, assigned=[1]))
    assert m.next_request(40).revoking_shards == []


def test_failed_heartbeats_never_resume_a_draining_shard() -> None:
    m = joined([1, 2])
    m.on_response(answer(m.next_request(10), assigned=[1]))
    for t in (20, 30, 40):
        m.next_request(t)
        m.request_failed()
    assert 2 not in m.readable(40) and 2 in m.draining


def test_draining_shard_assigned_again_resumes() -> None:
    m = joined([1, 2])
    m.on_response(answer(m.next_request(10), assigned=[1]))
    m.on_response(answer(m.next_request(20), assigned=[1, 2]))
    assert m.readable(20) == {1, 2} and not m.draining


def test_sync_metadata_is_drain_only_and_adopts_redis_version() -> None:
    m = joined([1, 2])
    req = m.next_request(10)
    assert req.metadata_version == 10
    reactions = m.on_response(
        answer(req, HeartbeatStatus.SYNC_METADATA, assigned=[2, 3], version=7)
    )
    assert {r.kind for r in reactions} == {ReactionKind.DRAIN}
    assert m.readable(10) == {2}  # 3 is new: not started before an OK
    assert m.metadata_version == 7 and m.highest_observed_version == 10
    assert m.next_request(20).metadata_version == 7


def test_revoke_pending_starts_nothing_new() -> None:
    m = joined([1])
    m.on_response(answer(m.next_request(10), HeartbeatStatus.REVOKE_PENDING, assigned=[1, 2]))
    assert m.readable(10) == {1}
    m.on_response(answer(m.next_request(20), assigned=[1, 2]))
    assert m.readable(20) == {1, 2}


def test_fencing_drops_everything_and_rejoins_with_empty_ownership() -> None:
    for status in (HeartbeatStatus.FENCED_MEMBER_EPOCH, HeartbeatStatus.UNKNOWN_MEMBER_ID):
        m = joined([1, 2])
        m.on_response(answer(m.next_request(10), assigned=[1]))
        reactions = m.on_response(answer(m.next_request(20), status))
        assert [(r.kind, set(r.shards)) for r in reactions] == [(ReactionKind.LOST, {1, 2})]
        assert m.readable(20) == frozenset()
        rejoin = m.next_request(30)
        assert rejoin.member_epoch == 0
        assert rejoin.owned_shards == [] and rejoin.revoking_shards == []


def test_answer_to_an_abandoned_request_is_ignored() -> None:
    m = joined([1])
    old = m.next_request(10)
    m.request_failed()
    new = m.next_request(20)
    assert m.on_response(answer(old, HeartbeatStatus.FENCED_MEMBER_EPOCH)) == []
    assert m.readable(20) == {1}
    m.on_response(answer(new, assigned=[1]))
    assert m.readable(20 + LEASE - 1) == {1}


def test_metadata_version_reported_is_the_highest_seen() -> None:
    m = joined([1])
    m.on_response(answer(m.next_request(10), assigned=[1], version=12))
    m.on_response(answer(m.next_request(20), assigned=[1], version=11))
    assert m.next_request(30).metadata_version == 12


def test_rejected_request_changes_nothing() -> None:
    m = joined([1])
    reactions = m.on_response(answer(m.next_request(10), HeartbeatStatus.INVALID_REQUEST))
    assert [r.kind for r in reactions] == [ReactionKind.REJECTED]
    assert m.reading == {1}


def test_stop_drains_everything_and_leave_sends_minus_one() -> None:
    m = joined([1, 2])
    assert m.stop() == {1, 2}
    assert m.readable(1) == frozenset()
    leave = m.leave_request(5)
    assert leave.member_epoch == -1 and leave.owned_shards == []


def test_start_over_after_leaving_joins_like_a_new_member() -> None:
    # A member whose Redis is unreachable stops, leaves, then starts over.
    m = joined([0, 1, 2])
    m.stop()
    m.drained(0)  # one shard drained, two abandoned mid-drain
    leave = m.leave_request(10)
    m.on_response(answer(leave, epoch=-1))
    m.start_over()
    assert (m.epoch, m.reading, m.draining, m.revoked, m.stopping) == (
        0,
        set(),
        set(),
        set(),
        False,
    )
    join = m.next_request(20)
    assert join.member_epoch == 0 and join.owned_shards == [] and join.revoking_shards == []
    reactions = m.on_response(answer(join, assigned=[1]))
    assert [(r.kind, sorted(r.shards)) for r in reactions] == [(ReactionKind.START, [1])]
    assert m.readable(20) == {1}
