"""The heartbeat decision: a pure function of (group, request, now, config).

The service loads the group under the group mutex, calls ``handle_heartbeat``,
writes ``result.changes`` with a revision CAS and only then sends
``result.response``.  Nothing here
does I/O or reads a clock.

Rules, in the order they are applied:

0. a join (memberEpoch 0) past the member limit -> ``TooManyMembers``
   (``TOO_MANY_MEMBERS``, see ``limits.join_refusal``); nothing changes.
1. protocol range -> UNSUPPORTED_PROTOCOL; body memberId != path, or an
   incarnation shaped like a principal identity -> INVALID_REQUEST.
2. timeouts due at ``now`` are applied first (lease expiry, rebalance-timeout
   fencing, release of fenced members' shards): see ``timeouts.py``.
3. a rollback witness (``witness.py``): a metadataVersion above the stored
   one, or an epoch above the member's record, from a member the group knows,
   live, under its incarnation, with numbers a coordinator could have issued
   -> open (or extend) a correction round; never raise the stored version to
   match.  Other claims are ignored (counted by the service).
4. memberEpoch 0 -> join / rejoin with empty ownership; releases nothing (it may be
   a late duplicate of an earlier join), the member lets go by omission later.
   A join under another incarnation than the stored member's, while that
   member is live or still holds shards -> ``MemberIdInUse`` (two processes
   share a member id; the second must not act as the first).
5. memberEpoch -1 -> graceful leave; -2 (with an incarnation) -> static leave,
   the member's target shards stay reserved until its lease ends.  A leave
   under another incarnation is ignored (forged, or from an earlier start).
6. memberEpoch > 0:
   * unknown member -> UNKNOWN_MEMBER_ID; another incarnation, expired or
     fenced -> FENCED_MEMBER_EPOCH (the stored member is left alone);
   * a rollback claim (rule 3, accepted or not) -> SYNC_METADATA, ownership
     untouched;
   * the member's previous epoch -> a retry whose response was lost: answer with
     the current view, change no ownership (a late duplicate must not release
     anything);
   * any other epoch than the current one -> FENCED_MEMBER_EPOCH, nothing changes;
   * the current epoch with a version below the answer that carried it (a
     report from a history Redis lost) -> SYNC_METADATA, nothing changes;
   * current epoch: validate ownership (claiming a shard it does not hold ->
     fence), release what it no longer reports, grant free target shards, bump
     the member epoch when its view changed.

Epochs are drawn from the clock and never repeat (``Draft._issue_epoch``), so
"the current epoch" is proof that a report was made in this history.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from streamkit.protocol import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    AssignmentView,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatStatus,
    MemberState,
    RevokingShardState,
    shard_ids,
)

from .config import CoordinatorConfig
from .draft import Draft
from .errors import Rejected
from .limits import join_refusal
from .model import PRINCIPAL_IDENTITY, GroupMetadata, MemberMetadata, replaced, same_process
from .result import Result, WitnessSeen, result_of
from .witness import Witness, rollback_witness


class MemberIdInUse(Rejected):
    """A join for a member id that a live process of another incarnation holds."""

    def __init__(self, member_id: str, holder_name: str | None) -> None:
        holder = f" ({holder_name})" if holder_name else ""
        super().__init__(
            "MEMBER_ID_IN_USE",
            f"member id {member_id!r} is in use by another process{holder}; two processes "
            "must not share a member id (the join is retried once the holder's lease has ended)",
        )
        self.member_id = member_id
        self.holder_name = holder_name


class TooManyMembers(Rejected):
    """A join the group has no room for (``limits.join_refusal`` says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__("TOO_MANY_MEMBERS", reason)


@dataclass(frozen=True, slots=True)
class HeartbeatOutcome:
    """What one rule decided; ``handle_heartbeat`` turns it into a ``Result``."""

    group: GroupMetadata
    response: HeartbeatResponse
    changed: bool


def handle_heartbeat(
    group: GroupMetadata,
    member_id: str,
    request: HeartbeatRequest,
    now_ms: int,
    config: CoordinatorConfig,
    principal: str | None = None,
) -> Result[HeartbeatResponse]:
    """The answer to one heartbeat and the changes to write before sending it.

    ``principal``: who sent it (None with the insecure member switch).  A
    request without an incarnation is taken as coming from the process that
    principal runs (``caller_identity``).

    Raises ``TooManyMembers`` for a join past the member limit (checked first:
    such a join changes nothing, whatever else it carries), ``MemberIdInUse``
    for a join of a member id another live process holds.
    """
    refusal = join_refusal(group, member_id, request, config)
    if refusal is not None:
        raise TooManyMembers(refusal)
    if not config.min_protocol_version <= request.protocol_version <= config.max_protocol_version:
        outcome = _reject(group, request, HeartbeatStatus.UNSUPPORTED_PROTOCOL, config)
        return Result(group, (), outcome.response)
    bad_epoch = request.member_epoch < LEAVE_EPOCH and not (
        request.member_epoch == STATIC_LEAVE_EPOCH and request.incarnation
    )
    # An incarnation shaped like a principal identity would let a caller pass
    # for that principal's member (``caller_identity``): no client draws one.
    posing = request.incarnation is not None and request.incarnation.startswith(PRINCIPAL_IDENTITY)
    if request.member_id != member_id or bad_epoch or posing:
        outcome = _reject(group, request, HeartbeatStatus.INVALID_REQUEST, config)
        return Result(group, (), outcome.response)
    request = caller_identity(request, principal)
    draft = Draft(group, now_ms, config)
    draft.apply_timeouts()
    witness = rollback_witness(draft.group, request, draft.now, draft.config)
    outcome = _decide(draft, member_id, request, witness)
    # The draft knows which members it touched: a steady heartbeat lists one
    # change without looking at the other members.
    result = result_of(group, outcome.group, outcome.response, draft.touched)
    if witness is Witness.NONE:
        return result
    member = group.members.get(member_id)
    seen = WitnessSeen(
        verdict=str(witness),
        member_id=member_id,
        claimed_version=request.metadata_version,
        stored_version=group.metadata_version,
        claimed_epoch=request.member_epoch,
        stored_epoch=None if member is None else member.member_epoch,
    )
    return replace(result, witness=seen)


def caller_identity(request: HeartbeatRequest, principal: str | None) -> HeartbeatRequest:
    """``request``, with its principal as its incarnation when it sent none.

    Reference clients send no incarnation, so any member credential could
    otherwise act as their members: leave one (its shards freed at once),
    report for it, or claim a rollback in its name.  The principal that joined
    a member is stored as its identity instead (``model.same_process``).  Our
    own clients send an incarnation, a secret of the process, which says more.
    """
    if request.incarnation is not None or principal is None:
        return request
    return replaced(request, incarnation=PRINCIPAL_IDENTITY + principal)


def _decide(
    draft: Draft, member_id: str, request: HeartbeatRequest, witness: Witness
) -> HeartbeatOutcome:
    if witness is Witness.ACCEPTED:
        draft.open_correction(max(request.metadata_version, draft.group.metadata_version))

    if request.member_epoch == 0:
        return _join(draft, request)
    if request.member_epoch < 0:
        return _leave(draft, request)

    member = draft.group.members.get(member_id)
    if member is None or member.state is MemberState.LEAVING:
        return _fence(draft, request, HeartbeatStatus.UNKNOWN_MEMBER_ID)
    if not same_process(member, request.incarnation):
        # Another process using this member id (or an earlier start of this
        # one): it is told it is not the member; the member itself is untouched.
        return _fence(draft, request, HeartbeatStatus.FENCED_MEMBER_EPOCH)
    if not member.live:
        return _fence(draft, request, HeartbeatStatus.FENCED_MEMBER_EPOCH)
    if witness is not Witness.NONE:
        # Metadata correction: the member saw state Redis no longer has (or
        # claims numbers no coordinator issued).  Its report cannot be checked
        # against Redis, so it changes nothing; the answer tells it which of
        # its shards it may keep.
        draft.record_liveness(member_id, request, current=False)
        return _answer(draft, request, member_id, resync=True)
    if request.member_epoch == member.previous_member_epoch != member.member_epoch:
        draft.record_liveness(member_id, request, current=False)
        return _answer(draft, request, member_id)
    if request.member_epoch != member.member_epoch:
        return _fence(draft, request, HeartbeatStatus.FENCED_MEMBER_EPOCH)
    if request.metadata_version < member.epoch_version:
        # The current epoch with a version below the one its answer carried:
        # the report was not made after that answer, so it comes from a
        # history Redis no longer has (the number was issued there too).  It
        # proves nothing about what the member holds now: nothing changes,
        # and the member is sent back to Redis' view.
        return _answer(draft, request, member_id, resync=True)
    return _reconcile(draft, request, member)


def _reconcile(draft: Draft, request: HeartbeatRequest, member: MemberMetadata) -> HeartbeatOutcome:
    member_id = member.member_id
    group = draft.group
    owned = {s.shard_index for s in request.owned_shards}
    # Ownership validation: every shard the member says it reads must be one
    # Redis records it as holding.  Anything else is a stale view of ownership.
    if any(group.owners.get(shard) != member_id for shard in owned):
        draft.fence_member(member_id)
        return _fence(draft, request, HeartbeatStatus.FENCED_MEMBER_EPOCH)

    still_draining = set()
    for report in request.revoking_shards:
        if report.shard is None:
            continue
        finished = report.state is RevokingShardState.REVOKED and not report.in_flight
        if not finished:
            still_draining.add(report.shard.shard_index)
        # A REVOKED report for a shard the member no longer holds is a duplicate
        # of an ack already applied (or from before a correction): ignored.

    # Release: a held shard the member neither reads nor is still draining has
    # been let go (an explicit REVOKED, or a repeat of one whose answer was lost).
    for shard in group.shards_held_by(member_id):
        if shard not in owned and shard not in still_draining:
            draft.release(shard)

    draft.record_liveness(member_id, request, current=True)
    draft.activate(member_id)
    if draft.may_grant():
        draft.grant_pending(member_id)
    draft.refresh_member_view(member_id)
    return _answer(draft, request, member_id)


def _join(draft: Draft, request: HeartbeatRequest) -> HeartbeatOutcome:
    member_id = request.member_id
    if request.owned_shards:
        # The contract: a (re)join starts from empty ownership.  Accepting
        # claims here would let a member that was fenced keep reading.
        return _reject(draft.original, request, HeartbeatStatus.INVALID_REQUEST, draft.config)
    existing = draft.group.members.get(member_id)
    if existing is not None and not same_process(existing, request.incarnation):
        if existing.static_leave_at_ms is None and (
            existing.live or draft.group.shards_held_by(member_id)
        ):
            # The holder may be reading (live, or fenced inside its lease):
            # this join is another process, and must wait until it is gone.
            raise MemberIdInUse(member_id, existing.member_name)
        # The earlier incarnation is gone and reads nothing, or left to restart.
        draft.add_member(member_id, request)
    elif existing is None or not existing.live or existing.static_leave_at_ms is not None:
        draft.add_member(member_id, request)
    # A join from a live member is a retried join whose answer was lost, a
    # restarted process, or a late duplicate of the join that arrived after
    # the member moved on (the simulation found that one).  Only the first two
    # read nothing, and they cannot be told apart, so the join releases
    # nothing: it answers the current view, and the member releases what it
    # does not read by omitting it from its next heartbeat.  For the same
    # reason its report may add to what the member is known to drain, never
    # take from it (``record_liveness``).
    draft.record_liveness(member_id, request, current=False)
    if draft.may_grant():
        draft.grant_pending(member_id)
    draft.refresh_member_view(member_id)
    return _answer(draft, request, member_id)


def _leave(draft: Draft, request: HeartbeatRequest) -> HeartbeatOutcome:
    member = draft.group.members.get(request.member_id)
    if member is not None and not same_process(member, request.incarnation):
        # A forged leave, or a late one from an earlier start of the process:
        # the member of this incarnation may be reading, so nothing is freed.
        return _fence(draft, request, HeartbeatStatus.FENCED_MEMBER_EPOCH)
    if member is not None and member.state in (
        MemberState.STARTING,
        MemberState.ACTIVE,
        MemberState.FENCED,
    ):
        # The member drained before leaving (that is the contract of a leave),
        # so its shards move at once, without waiting for a lease.
        if request.member_epoch == STATIC_LEAVE_EPOCH and member.live:
            draft.leave_static(request.member_id)
        else:
            draft.remove_member(request.member_id)
    group = draft.finish()
    return HeartbeatOutcome(
        group=group,
        response=_response(
            group, request, HeartbeatStatus.OK, request.member_epoch, [], [], draft.config
        ),
        changed=group is not draft.original,
    )


def _answer(
    draft: Draft, request: HeartbeatRequest, member_id: str, *, resync: bool = False
) -> HeartbeatOutcome:
    group = draft.finish()
    member = group.members[member_id]
    assigned = group.assigned_to(member_id)
    pending = group.pending_for(member_id)
    status = HeartbeatStatus.OK
    if resync:
        status = HeartbeatStatus.SYNC_METADATA
    elif group.correction is not None:
        # Compared with the version the member could have seen: a change made
        # by this very heartbeat (its own release) must not send it to resync.
        if request.metadata_version != draft.original.metadata_version:
            status = HeartbeatStatus.SYNC_METADATA
        else:
            status = HeartbeatStatus.REVOKE_PENDING
    return HeartbeatOutcome(
        group=group,
        response=_response(
            group, request, status, member.member_epoch, assigned, pending, draft.config
        ),
        changed=group is not draft.original,
    )


def _fence(draft: Draft, request: HeartbeatRequest, status: HeartbeatStatus) -> HeartbeatOutcome:
    group = draft.finish()
    return HeartbeatOutcome(
        group=group,
        response=_response(group, request, status, 0, [], [], draft.config),
        changed=group is not draft.original,
    )


def _reject(
    group: GroupMetadata,
    request: HeartbeatRequest,
    status: HeartbeatStatus,
    config: CoordinatorConfig,
) -> HeartbeatOutcome:
    return HeartbeatOutcome(
        group=group,
        response=_response(group, request, status, request.member_epoch, [], [], config),
        changed=False,
    )


def _response(
    group: GroupMetadata,
    request: HeartbeatRequest,
    status: HeartbeatStatus,
    member_epoch: int,
    assigned: list[int],
    pending: list[int],
    config: CoordinatorConfig,
) -> HeartbeatResponse:
    return HeartbeatResponse(
        response_to=request.request_id,
        status=status,
        member_id=request.member_id,
        member_epoch=member_epoch,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        rebalance_timeout_ms=config.rebalance_timeout_ms,
        group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch,
        metadata_version=group.metadata_version,
        assignment=AssignmentView(
            assigned_shards=shard_ids(assigned),
            pending_shards=shard_ids(pending),
            metadata_version=group.metadata_version,
        ),
    )
