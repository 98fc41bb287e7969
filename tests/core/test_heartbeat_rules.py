"""One test per heartbeat rule of SPEC §3 and the seeds, against the pure core."""

from __future__ import annotations

from streamkit.protocol import (
    GroupState,
    HeartbeatStatus,
    MemberState,
    ShardConsumptionProgress,
    ShardId,
)
from streamkit_server.core import begin_correction, new_group

from .harness import CONFIG, Answer, Harness, request

OK = HeartbeatStatus.OK


def two_members_rebalancing() -> tuple[Harness, int, int]:
    """a held all four shards; b joined, so a must give up 2 and 3.

    Returns the harness and the epochs a and b were last told.
    """
    h = Harness()
    a = h.join("a")
    assert a.assigned == [0, 1, 2, 3]
    a = h.steady("a", a)
    b = h.join("b")
    assert b.assigned == [] and b.pending == [2, 3]
    a = h.steady("a", a)  # the DRAIN: 2 and 3 leave a's assignment
    assert a.assigned == [0, 1]
    return h, a.epoch, b.epoch


# -- request validation ---------------------------------------------------------


def test_protocol_version_outside_supported_range_is_unsupported_protocol() -> None:
    h = Harness()
    answer = h.beat("a", request("a", 0, protocol_version=2))
    assert answer.status is HeartbeatStatus.UNSUPPORTED_PROTOCOL
    assert h.writes == 0 and "a" not in h.group.members


def test_body_member_id_differing_from_path_is_invalid_request() -> None:
    h = Harness()
    answer = h.beat("a", request("a", 0, body_member_id="b"), path_id="a")
    assert answer.status is HeartbeatStatus.INVALID_REQUEST
    assert h.writes == 0


def test_epoch_below_minus_one_is_invalid_request() -> None:
    h = Harness()
    assert h.beat("a", request("a", -2)).status is HeartbeatStatus.INVALID_REQUEST


# -- join, rejoin, leave ----------------------------------------------------------


def test_join_with_epoch_zero_gets_an_epoch_and_the_free_shards() -> None:
    h = Harness()
    answer = h.join("a")
    assert answer.status is OK and answer.epoch > 0
    assert answer.assigned == [0, 1, 2, 3]
    assert h.group.members["a"].state is MemberState.STARTING
    assert h.group.owners == {0: "a", 1: "a", 2: "a", 3: "a"}


def test_join_reporting_ownership_is_invalid_request() -> None:
    h = Harness()
    answer = h.beat("a", request("a", 0, owned=[1]))
    assert answer.status is HeartbeatStatus.INVALID_REQUEST
    assert "a" not in h.group.members


def test_retried_join_whose_answer_was_lost_gets_the_same_assignment() -> None:
    h = Harness()
    first = h.join("a")
    again = h.join("a")
    assert (again.epoch, again.assigned) == (first.epoch, first.assigned)
    assert h.group.group_epoch == 1  # membership did not change twice


def test_late_duplicate_of_a_join_releases_nothing() -> None:
    """Found by the simulation: a join delayed in the network arrives after the
    member joined through a retry and reads shards another member now targets."""
    h = Harness()
    join = request("a", 0, request_id="join-1")
    a = h.beat("a", request("a", 0, request_id="join-2"))
    assert a.assigned == [0, 1, 2, 3]
    h.join("b")  # b's target now includes shards a still reads
    h.beat("a", join)  # the first join, late
    assert h.group.shards_held_by("a") == [0, 1, 2, 3]
    b = h.beat(
        "b", request("b", h.group.members["b"].member_epoch, version=h.group.metadata_version)
    )
    assert b.assigned == []


def test_graceful_leave_releases_shards_at_once() -> None:
    h, _a_epoch, b_epoch = two_members_rebalancing()
    answer = h.beat("a", request("a", -1))
    assert answer.status is OK and answer.epoch == -1
    assert h.group.members["a"].state is MemberState.LEAVING
    # b gets everything on its next heartbeat: no lease wait.
    b = h.beat("b", request("b", b_epoch, version=h.group.metadata_version))
    assert b.assigned == [0, 1, 2, 3]


def test_leave_of_unknown_member_is_harmless() -> None:
    h = Harness()
    answer = h.beat("ghost", request("ghost", -1))
    assert answer.status is OK and h.writes == 0


# -- epochs and fencing -----------------------------------------------------------


def test_positive_epoch_from_unknown_member_is_unknown_member_id() -> None:
    h = Harness()
    answer = h.beat("a", request("a", 7))
    assert answer.status is HeartbeatStatus.UNKNOWN_MEMBER_ID
    assert h.writes == 0


def test_older_epoch_is_fenced_and_changes_nothing() -> None:
    h, a_epoch, _ = two_members_rebalancing()
    a = h.beat(
        "a", request("a", a_epoch, owned=[0, 1], revoked=[2, 3], version=h.group.metadata_version)
    )
    assert a.epoch > a_epoch > 1  # so epoch 1 is neither current nor previous
    before = h.group
    stale = h.beat("a", request("a", 1, owned=[0, 1], version=h.group.metadata_version))
    assert stale.status is HeartbeatStatus.FENCED_MEMBER_EPOCH
    assert h.group.owners == before.owners
    assert h.group.members["a"].state is before.members["a"].state


def test_an_epoch_never_issued_to_the_member_is_a_rollback_witness() -> None:
    """An epoch above the member's record was issued in a history Redis lost:
    the report changes nothing, the member is sent back to Redis' view, and a
    correction round holds every grant back."""
    h = Harness()
    a = h.steady("a", h.join("a"))
    owners = dict(h.group.owners)
    answer = h.beat("a", request("a", a.epoch + 5, owned=[0, 1, 2, 3], version=a.version))
    assert answer.status is HeartbeatStatus.SYNC_METADATA
    assert answer.epoch == a.epoch and answer.assigned == [0, 1, 2, 3]
    assert h.group.owners == owners
    assert h.group.correction is not None


def test_previous_epoch_means_lost_response_and_gets_current_view_not_a_fence() -> None:
    h = Harness()
    a = h.join("a")
    a = h.steady("a", a)
    h.join("b")
    drain = h.steady("a", a)  # epoch bumps; pretend this answer was lost
    assert drain.epoch != a.epoch
    retry = h.beat("a", request("a", a.epoch, owned=[0, 1, 2, 3], version=a.version))
    assert retry.status is OK
    assert (retry.epoch, retry.assigned) == (drain.epoch, drain.assigned)


def test_report_at_previous_epoch_never_releases_anything() -> None:
    """A late duplicate must not be read as 'the member let go of its shards'."""
    h = Harness()
    a = h.join("a")
    a = h.steady("a", a)
    h.join("b")
    new = h.steady("a", a)
    owners = dict(h.group.owners)
    h.beat("a", request("a", a.epoch, owned=[0], version=a.version))
    assert new.epoch != a.epoch
    assert h.group.owners == owners


def test_claiming_a_shard_the_member_does_not_hold_is_stale_ownership_and_fenced() -> None:
    h, _a_epoch, b_epoch = two_members_rebalancing()
    answer = h.beat("b", request("b", b_epoch, owned=[2], version=h.group.metadata_version))
    assert answer.status is HeartbeatStatus.FENCED_MEMBER_EPOCH
    assert h.group.members["b"].state is MemberState.FENCED


def test_fenced_members_shards_are_held_for_one_lease_then_move() -> None:
    """A fenced member may read until it hears of the fence: its shards wait out its lease."""
    h = Harness()
    a = h.join("a")
    a = h.steady("a", a)
    b = h.join("b")
    fence = h.beat("a", request("a", a.epoch, owned=[0, 1, 2, 3, 9], version=a.version))
    assert fence.status is HeartbeatStatus.FENCED_MEMBER_EPOCH
    assert h.group.shards_held_by("a") == [0, 1, 2, 3]
    assert h.group.target == {0: "b", 1: "b", 2: "b", 3: "b"}
    h.advance(CONFIG.member_lease_ttl_ms - 1)
    b = h.beat("b", request("b", b.epoch, version=h.group.metadata_version))
    assert b.assigned == [] and b.pending == [0, 1, 2, 3]
    h.advance(1)
    b = h.beat("b", request("b", b.epoch, version=h.group.metadata_version))
    assert b.assigned == [0, 1, 2, 3]


def test_fenced_member_rejoining_with_epoch_zero_takes_its_shards_back() -> None:
    h = Harness()
    a = h.join("a")
    a = h.steady("a", a)
    assert h.beat("a", request("a", a.epoch, owned=[9], version=a.version)).status is (
        HeartbeatStatus.FENCED_MEMBER_EPOCH
    )
    assert h.group.shards_held_by("a") == [0, 1, 2, 3]
    rejoin = h.join("a")
    assert rejoin.status is OK and rejoin.assigned == [0, 1, 2, 3]
    assert h.group.members["a"].state is MemberState.STARTING


def test_expired_member_heartbeating_again_is_fenced() -> None:
    h = Harness()
    a = h.join("a")
    h.advance(CONFIG.member_lease_ttl_ms + 1)
    answer = h.beat("a", request("a", a.epoch, owned=a.assigned, version=a.version))
    assert answer.status is HeartbeatStatus.FENCED_MEMBER_EPOCH
    assert h.group.members["a"].state is MemberState.EXPIRED
    assert h.group.owners == {}


# -- revoke before assign -----------------------------------------------------------


def test_drain_decision_is_repeated_when_its_answer_was_lost() -> None:
    h, a_epoch, _ = two_members_rebalancing()
    # a never got the DRAIN answer and retries with what it had.
    again = h.beat("a", request("a", a_epoch, owned=[0, 1, 2, 3], version=h.group.metadata_version))
    third = h.beat("a", request("a", a_epoch, owned=[0, 1, 2, 3], version=h.group.metadata_version))
    assert again.assigned == third.assigned == [0, 1]


def test_new_owner_sees_shard_pending_until_previous_owner_reports_revoked() -> None:
    h, a_epoch, b_epoch = two_members_rebalancing()
    a = h.beat(
        "a", request("a", a_epoch, owned=[0, 1], draining=[2, 3], version=h.group.metadata_version)
    )
    b = h.beat("b", request("b", b_epoch, version=h.group.metadata_version))
    assert b.assigned == [] and b.pending == [2, 3]
    h.beat("a", request("a", a.epoch, owned=[0, 1], revoked=[2, 3], version=a.version))
    b = h.beat("b", request("b", b.epoch, version=h.group.metadata_version))
    assert b.assigned == [2, 3] and b.pending == []


def test_revoked_with_work_in_flight_does_not_release() -> None:
    h, a_epoch, _b_epoch = two_members_rebalancing()
    h.beat(
        "a",
        request(
            "a",
            a_epoch,
            owned=[0, 1],
            revoked=[2, 3],
            in_flight=3,
            version=h.group.metadata_version,
        ),
    )
    assert h.group.shards_held_by("a") == [0, 1, 2, 3]


def test_revoked_ack_whose_answer_was_lost_still_lets_new_owner_in() -> None:
    h, a_epoch, b_epoch = two_members_rebalancing()
    h.beat(
        "a", request("a", a_epoch, owned=[0, 1], revoked=[2, 3], version=h.group.metadata_version)
    )  # answer lost
    b = h.beat("b", request("b", b_epoch, version=h.group.metadata_version))
    assert b.assigned == [2, 3]
    # a repeats the REVOKED report: a duplicate terminal report is ignored, not fenced.
    again = h.beat(
        "a", request("a", a_epoch, owned=[0, 1], revoked=[2, 3], version=h.group.metadata_version)
    )
    assert again.status is OK
    assert h.group.shards_held_by("b") == [2, 3]


def test_previous_owner_expiring_while_draining_releases_after_ttl_not_before() -> None:
    h, a_epoch, b_epoch = two_members_rebalancing()
    h.beat(
        "a", request("a", a_epoch, owned=[0, 1], draining=[2, 3], version=h.group.metadata_version)
    )
    last_a = h.now
    for _ in range(9):
        h.advance(100)
        b = h.beat("b", request("b", b_epoch, version=h.group.metadata_version))
        b_epoch = b.epoch
        assert b.assigned == [], f"handed over at {h.now}, a's lease runs to {last_a + 1000}"
    h.advance(CONFIG.member_lease_ttl_ms)
    b = h.beat("b", request("b", b_epoch, version=h.group.metadata_version))
    assert b.assigned == [0, 1, 2, 3]
    assert h.group.members["a"].state is MemberState.EXPIRED


def test_member_exceeding_rebalance_timeout_is_fenced() -> None:
    h, a_epoch, b_epoch = two_members_rebalancing()
    a = h.beat(
        "a", request("a", a_epoch, owned=[0, 1], draining=[2, 3], version=h.group.metadata_version)
    )
    # a keeps heartbeating but never finishes draining.
    while h.now <= CONFIG.rebalance_timeout_ms:
        h.advance(500)
        a = h.beat("a", request("a", a.epoch, owned=[0, 1], draining=[2, 3], version=a.version))
        if a.status is not OK:
            break
        h.beat("b", request("b", b_epoch, version=h.group.metadata_version))
        b_epoch = h.group.members["b"].member_epoch
    assert a.status is HeartbeatStatus.FENCED_MEMBER_EPOCH
    assert h.group.members["a"].state is MemberState.FENCED


def test_unaffected_member_keeps_its_shards_through_a_rebalance() -> None:
    h = Harness(group=new_group("orders", "billing", 6, 0))
    a = h.join("a")
    a = h.steady("a", a)
    b = h.join("b")
    a = h.steady("a", a, revoked=[s for s in range(6) if s not in h.group.assigned_to("a")])
    b = h.steady("b", b)
    before_a = set(a.assigned)
    h.join("c")
    a2 = h.steady("a", a)
    assert set(a2.assigned) <= before_a and len(a2.assigned) == 2


# -- idempotency ---------------------------------------------------------------------


def test_same_heartbeat_twice_gives_the_same_decision() -> None:
    h, _a_epoch, b_epoch = two_members_rebalancing()
    req = request("b", b_epoch, version=h.group.metadata_version)
    first = h.beat("b", req)
    second = h.beat("b", req)
    assert (first.status, first.epoch, first.assigned, first.pending) == (
        second.status,
        second.epoch,
        second.assigned,
        second.pending,
    )


def test_steady_heartbeat_does_not_bump_metadata_version() -> None:
    h = Harness()
    a = h.join("a")
    a = h.steady("a", a)
    version = h.group.metadata_version
    for _ in range(3):
        h.advance(100)
        a = h.steady("a", a)
    assert h.group.metadata_version == version
    assert h.group.members["a"].last_heartbeat_ms == h.now


# -- metadata version correction -------------------------------------------------------


def rolled_back() -> tuple[Harness, int, int]:
    """a saw version N; Redis went back to N-1 (b's join is forgotten)."""
    h = Harness()
    a = h.join("a")
    a = h.steady("a", a)
    snapshot = h.group
    h.join("b")
    a = h.steady("a", a)
    seen = a.version
    h.group = snapshot  # Redis lost the writes
    assert seen > h.group.metadata_version
    return h, a.epoch, seen


def test_member_ahead_of_redis_gets_sync_metadata_and_redis_version_is_not_raised() -> None:
    h, a_epoch, seen = rolled_back()
    stored = h.group.metadata_version
    answer = h.beat("a", request("a", a_epoch, owned=[0, 1], version=seen))
    assert answer.status is HeartbeatStatus.SYNC_METADATA
    assert answer.version == stored == h.group.metadata_version
    assert h.group.correction is not None
    assert h.group.correction.highest_reported_version == seen


def test_sync_metadata_is_repeated_while_the_member_reports_the_higher_version() -> None:
    h, a_epoch, seen = rolled_back()
    first = h.beat("a", request("a", a_epoch, owned=[0, 1], version=seen))
    again = h.beat("a", request("a", a_epoch, owned=[0, 1], version=seen))
    assert first.status is again.status is HeartbeatStatus.SYNC_METADATA
    assert (first.epoch, first.assigned, first.version) == (
        again.epoch,
        again.assigned,
        again.version,
    )


def test_synced_member_gets_revoke_pending_until_round_closes_then_ok() -> None:
    h, a_epoch, seen = rolled_back()
    sync = h.beat("a", request("a", a_epoch, owned=[0, 1], version=seen))
    pending = h.beat("a", request("a", sync.epoch, owned=sync.assigned, version=sync.version))
    assert pending.status is HeartbeatStatus.REVOKE_PENDING
    h.advance(CONFIG.member_lease_ttl_ms - 1)
    still = h.beat(
        "a", request("a", pending.epoch, owned=pending.assigned, version=pending.version)
    )
    assert still.status is HeartbeatStatus.REVOKE_PENDING
    h.advance(1)
    ok = h.beat("a", request("a", still.epoch, owned=still.assigned, version=still.version))
    assert ok.status is OK
    assert h.group.correction is None


def test_a_new_regression_restarts_an_open_rounds_wait() -> None:
    """A round's wait counts from the *last* regression noticed: writes lost in
    a later rollback may have renewed leases after the round began (the zone
    failure in docs/testing.md), so the old start would close it too early."""
    h, a_epoch, seen = rolled_back()
    sync = h.beat("a", request("a", a_epoch, owned=[0, 1], version=seen))
    assert h.group.correction is not None
    h.advance(CONFIG.member_lease_ttl_ms - 1)
    h.apply(begin_correction(h.group, h.now, CONFIG, seen))  # Redis went back again
    assert h.group.correction is not None
    renewed = h.now
    assert h.group.correction.started_at_ms == renewed
    h.advance(1)  # the first regression's lease has passed; the second's has not
    pending = h.beat("a", request("a", sync.epoch, owned=sync.assigned, version=sync.version))
    assert pending.status is HeartbeatStatus.REVOKE_PENDING
    assert h.group.correction is not None
    h.advance(renewed + CONFIG.member_lease_ttl_ms - h.now)
    ok = h.beat("a", request("a", pending.epoch, owned=pending.assigned, version=pending.version))
    assert ok.status is OK
    assert h.group.correction is None


def test_no_shard_moves_to_a_new_holder_during_a_correction_round() -> None:
    h, a_epoch, seen = rolled_back()
    h.beat("a", request("a", a_epoch, owned=[0, 1], version=seen))
    # c joins during the round and a lets shards go: nothing is granted.
    c = h.join("c")
    assert c.assigned == [] and c.status is not OK
    assert "c" not in h.group.owners.values()


def test_stale_revokes_during_correction_change_only_what_redis_supports() -> None:
    h, a_epoch, seen = rolled_back()
    owners = dict(h.group.owners)
    # b is unknown to Redis now; its REVOKED report for shards Redis says a holds
    # must change nothing.
    answer = h.beat("b", request("b", 3, owned=[], revoked=[2, 3], version=seen))
    assert answer.status is HeartbeatStatus.UNKNOWN_MEMBER_ID
    assert h.group.owners == owners
    # a, at the higher version, reports revokes: its report is not applied either.
    h.beat("a", request("a", a_epoch, owned=[0, 1], revoked=[2, 3], version=seen))
    assert h.group.owners == owners


# -- timeouts -------------------------------------------------------------------------


def test_tick_expires_silent_members_and_rebalances() -> None:
    h, _, _b_epoch = two_members_rebalancing()
    h.advance(CONFIG.member_lease_ttl_ms + 1)
    h.tick()
    assert {m.state for m in h.group.members.values()} == {MemberState.EXPIRED}
    assert h.group.owners == {} and h.group.state is GroupState.EMPTY


def test_tick_with_nothing_due_returns_the_same_object() -> None:
    h = Harness()
    h.join("a")
    group = h.group
    h.tick()
    assert h.group is group


def test_group_state_goes_reconciling_then_stable() -> None:
    h, a_epoch, b_epoch = two_members_rebalancing()
    assert h.group.state is GroupState.RECONCILING
    a = h.beat(
        "a", request("a", a_epoch, owned=[0, 1], revoked=[2, 3], version=h.group.metadata_version)
    )
    h.beat("b", request("b", b_epoch, version=h.group.metadata_version))
    assert h.group.state is GroupState.STABLE
    assert a.status is OK


def test_reported_progress_is_kept_only_for_held_shards() -> None:
    h, a_epoch, _ = two_members_rebalancing()
    req = request("a", a_epoch, owned=[0, 1], revoked=[2, 3], version=h.group.metadata_version)
    req.shard_progress = [
        ShardConsumptionProgress(shard=ShardId(shard_index=s), last_acked_id="1-0")
        for s in (0, 1, 2, 3, 9)
    ]
    h.beat("a", req)
    assert sorted(h.group.members["a"].progress) == [0, 1]


def a_drains_a_grant_redis_forgot() -> tuple[Harness, Answer, Answer]:
    """b left and a was granted 2 and 3; Redis lost that, so it thinks b holds
    them.  a, told SYNC_METADATA, still has entries of 2 and 3 in flight; c
    joined during the round (a syncs again to the version of c's join) and
    waits for shards."""
    h = Harness()
    a = h.steady("a", h.join("a"))
    b = h.join("b")
    a = h.steady("a", a)  # the DRAIN of 2 and 3
    a = h.steady("a", a, revoked=[2, 3])
    b = h.steady("b", b)
    assert b.assigned == [2, 3]
    snapshot = h.group
    h.beat("b", request("b", -1))  # b leaves; a gets 2 and 3: the writes Redis loses
    a = h.steady("a", a)
    a = h.steady("a", a)
    assert a.assigned == [0, 1, 2, 3]
    h.group = snapshot
    sync = h.beat("a", request("a", a.epoch, owned=[0, 1, 2, 3], version=a.version))
    assert sync.status is HeartbeatStatus.SYNC_METADATA and sync.assigned == [0, 1]
    c = h.join("c")
    sync = h.beat("a", request("a", sync.epoch, owned=[0, 1], version=a.version))
    pending = h.steady("a", sync, draining=[2, 3])
    assert pending.status is HeartbeatStatus.REVOKE_PENDING
    assert h.group.members["a"].draining_unrecorded == [2, 3]
    return h, pending, c


def test_a_correction_round_stays_open_while_a_forgotten_grant_is_drained() -> None:
    h, a, c = a_drains_a_grant_redis_forgot()
    for _ in range(4):  # b expires; the round's lease passes; a keeps draining
        h.advance(CONFIG.member_lease_ttl_ms // 2)
        c = h.steady("c", c)
        a = h.steady("a", a, draining=[2, 3])
        h.tick()
    assert h.group.correction is not None
    assert h.group.members["b"].state is MemberState.EXPIRED
    assert set(h.group.owners) == {0, 1}  # 2 and 3 are free, and granted to nobody
    a = h.steady("a", a, revoked=[2, 3])  # the drain finished
    assert h.group.correction is None
    c = h.steady("c", c)
    assert c.assigned == [2, 3]


def test_a_drain_of_forgotten_shards_cannot_hold_the_round_forever() -> None:
    h, a, c = a_drains_a_grant_redis_forgot()
    assert h.group.correction is not None
    started = h.group.correction.started_at_ms
    overdue = started + CONFIG.member_lease_ttl_ms + CONFIG.rebalance_timeout_ms + 1
    while h.now < overdue:
        h.advance(CONFIG.heartbeat_interval_ms)
        c = h.steady("c", c)
        a = h.steady("a", a, draining=[2, 3])
    assert a.status is HeartbeatStatus.FENCED_MEMBER_EPOCH
    fenced_at = h.group.members["a"].fenced_at_ms
    assert fenced_at is not None
    h.advance(CONFIG.member_lease_ttl_ms - 1)
    c = h.steady("c", c)
    assert h.group.correction is not None  # a's entries may still be in flight
    assert c.assigned == []
    h.advance(1)
    c = h.steady("c", c)
    assert h.group.correction is None
    c = h.steady("c", c)
    assert c.assigned == [0, 1, 2, 3]
