"""A copy-on-write working copy of a group, with the transitions the core uses.

``Draft`` is private to the core: ``handle_heartbeat`` and ``tick`` build one,
apply transitions, and ``finish()`` returns either the untouched input (no
write needed) or a new ``GroupMetadata`` with the epochs and versions bumped
exactly once.  Only the containers that change are copied: a steady
heartbeat copies the member map (to write its own record) and nothing else,
and asks the group's per-member ownership index instead of scanning the
shards.  ``target`` is only ever replaced, never changed in place.
"""

from __future__ import annotations

from typing import Final

from streamkit.protocol import GroupState, HeartbeatRequest, MemberState, RevokingShardState

from .assignor import assign
from .config import CoordinatorConfig
from .deadlines import earliest_deadline_ms
from .limits import RECORDS_PER_MEMBER_SLOT, evictable_records
from .model import (
    NEVER_MS,
    CorrectionRound,
    GroupMetadata,
    MemberMetadata,
    ShardProgress,
    identity,
    replaced,
)

#: Member epochs count in thousandths of a millisecond of the issuing
#: coordinator's clock: an epoch is ``now_ms * EPOCHS_PER_MS``, or one above
#: the last one issued when that is higher (several in one millisecond).
#: Numbers issued later are therefore higher even when Redis lost the record
#: of the earlier ones.  About 1.8e15 today: far below 2**53, so JSON readers
#: that parse numbers as doubles (the console) still see them exactly.
EPOCHS_PER_MS: Final = 1_000


def epoch_floor(now_ms: int) -> int:
    """The lowest epoch a coordinator may issue at ``now_ms``."""
    return now_ms * EPOCHS_PER_MS


class Draft:
    def __init__(self, group: GroupMetadata, now_ms: int, config: CoordinatorConfig) -> None:
        self.original = group
        # Shallow: the member, owner and target maps are shared with
        # ``original`` until a transition writes one (``_members_for_write``,
        # ``_owners_for_write``).  A steady heartbeat writes only its own member,
        # so it copies one map, and ``diff`` sees the untouched maps by identity
        # instead of comparing them entry by entry.
        self.group = replaced(group)
        self._members_copied = False
        self._owners_copied = False
        self.now = now_ms
        self.config = config
        # ``dirty``: anything changed (the group must be written).
        # ``observable``: something members or producers must see changed
        # (bumps metadataVersion).
        self.dirty = False
        self.observable = False
        self.membership_changed = False
        self.timeouts_scanned = False
        # Member ids whose record may have changed (added, updated, removed):
        # lets the result list its changes without comparing every member.
        self.touched: set[str] = set()
        # Members issued a new epoch: ``finish`` stamps it with the version
        # of the answer that carries it (``MemberMetadata.epoch_version``).
        self.issued: set[str] = set()

    def _members_for_write(self) -> dict[str, MemberMetadata]:
        if not self._members_copied:
            self.group.members = dict(self.group.members)
            self._members_copied = True
        return self.group.members

    def _owners_for_write(self) -> dict[int, str]:
        """``owners`` to change in place: this draft's own copy, its index dropped."""
        if not self._owners_copied:
            self.group.owners = dict(self.group.owners)
            self._owners_copied = True
        self.group.forget_ownership_index()
        return self.group.owners

    # -- members ---------------------------------------------------------

    def _update_member(self, member_id: str, **changes: object) -> MemberMetadata:
        member = replaced(self.group.members[member_id], **changes)
        self._members_for_write()[member_id] = member
        self.touched.add(member_id)
        self.dirty = True
        return member

    def add_member(self, member_id: str, request: HeartbeatRequest) -> None:
        # Shards a fenced earlier record of this member still holds stay held,
        # now by the new one.  Only the same incarnation gets here while they
        # are held (another is refused until they are free), so this is the
        # fenced process itself: it rejoined after dropping everything, or
        # this is a late duplicate of such a join.  It lets them go by omitting
        # them from its next heartbeat.
        members = self._members_for_write()
        if member_id not in members:
            # Departed records past the cap make room, oldest first, among
            # those that hold nothing (``join_refusal`` checked one exists).
            cap = RECORDS_PER_MEMBER_SLOT * self.config.max_members_per_group
            for departed in evictable_records(self.group)[: max(0, len(members) + 1 - cap)]:
                del members[departed]
                self.touched.add(departed)
        members[member_id] = MemberMetadata(
            member_id=member_id,
            member_name=request.member_name,
            **identity(request.incarnation),
            state=MemberState.STARTING,
            joined_at_ms=self.now,
            last_heartbeat_ms=self.now,
        )
        self.touched.add(member_id)
        self.dirty = self.observable = self.membership_changed = True
        self.rebalance()

    def remove_member(self, member_id: str) -> None:
        """Graceful leave: the member says it drained, so everything it held is free."""
        self._end_member(member_id, MemberState.LEAVING)

    def leave_static(self, member_id: str) -> None:
        """A static member drained and left to restart: free what it held, but
        keep it in the assignment until its lease runs out (counted from now),
        so its next incarnation gets the same shards back.

        A fresh epoch (also as the "previous" one) fences any late heartbeat of
        the incarnation that left; it can no longer be granted anything.
        """
        for shard in self.group.shards_held_by(member_id):
            self.release(shard)
        self._issue_epoch(member_id)
        self._update_member(
            member_id,
            static_leave_at_ms=self.now,
            last_heartbeat_ms=self.now,
            previous_member_epoch=self.group.members[member_id].member_epoch,
            assigned=[],
            holding=[],
            revoke_deadline_ms=None,
        )

    def fence_member(self, member_id: str) -> None:
        """Fence a live member.  Its shards stay held until its lease must have run out.

        The member may still be reading when the fence is decided (it learns of
        it only from its next response), so handing its shards over at once
        could create two readers.  They are released by ``apply_timeouts`` one
        member lease after the fence, or by the member itself: a leave (-1), or
        a rejoin followed by a heartbeat that no longer reports them.
        """
        self._update_member(
            member_id,
            state=MemberState.FENCED,
            fenced_at_ms=self.now,
            dead_since_ms=self.now,
            revoke_deadline_ms=None,
        )
        self.observable = self.membership_changed = True
        self.rebalance()

    def expire_member(self, member_id: str) -> None:
        # Its lease ran out on the coordinator's clock, and the member's local
        # lease is never longer and starts no later, so it has stopped reading.
        self._end_member(member_id, MemberState.EXPIRED)

    def _end_member(self, member_id: str, state: MemberState) -> None:
        """The member is gone and provably reads nothing: free all it held."""
        for shard in self.group.shards_held_by(member_id):
            self.release(shard)
        self._update_member(
            member_id,
            state=state,
            dead_since_ms=self.now,
            assigned=[],
            holding=[],
            revoke_deadline_ms=None,
        )
        self.observable = self.membership_changed = True
        self.rebalance()

    def activate(self, member_id: str) -> None:
        if self.group.members[member_id].state is MemberState.STARTING:
            self._update_member(member_id, state=MemberState.ACTIVE)
            self.observable = True

    def record_liveness(self, member_id: str, request: HeartbeatRequest, *, current: bool) -> None:
        """Record a heartbeat of the member (its lease runs from now).

        ``current``: the report is the member's newest, proven by its epoch
        and version.  Any other report (a retry, a join, one answered
        SYNC_METADATA) may be older than what the member has said since, so it
        may only raise the version it reports and add to the shards it is known
        to drain, never lower or clear them: a stale report that cleared a
        forgotten drain would let a correction round close under a reader.
        """
        capacity = request.runtime_consumer_capacity
        member = self.group.members[member_id]
        # Keep progress only for shards the member still holds, so retired and
        # handed-over shards do not pile up in the aggregate.
        held = set(self.group.shards_held_by(member_id))
        progress = {s: p for s, p in member.progress.items() if s in held}
        for report in request.shard_progress:
            if report.shard is None or report.shard.shard_index not in held:
                continue
            progress[report.shard.shard_index] = ShardProgress(
                stream_key=report.stream_key,
                last_delivered_id=report.last_delivered_id,
                last_acked_id=report.last_acked_id,
                pending_count=report.pending_count or 0,
                updated_at_ms=self.now,
            )
        unrecorded = {
            report.shard.shard_index
            for report in request.revoking_shards
            if report.shard is not None
            and (report.state is not RevokingShardState.REVOKED or report.in_flight)
        }
        version = request.metadata_version
        if not current:
            unrecorded.update(member.draining_unrecorded)
            version = max(version, member.last_reported_version)
        self._update_member(
            member_id,
            last_heartbeat_ms=self.now,
            last_reported_version=version,
            draining_unrecorded=sorted(unrecorded - held),
            member_name=request.member_name or member.member_name,
            runtime_max_concurrency=capacity.runtime_max_concurrency or 1,
            available_concurrency=capacity.available_concurrency or 0,
            progress=progress,
        )

    def _issue_epoch(self, member_id: str) -> None:
        # From the clock, not from the counter alone: after Redis lost writes
        # the counter is back where the restored state left it, and counting
        # on from there would issue the lost history's numbers again, to other
        # assignments.  A number drawn later in time is higher than any the
        # lost history drew (and ``open_correction`` jumps past clock skew).
        epoch = max(self.group.last_issued_member_epoch + 1, epoch_floor(self.now))
        self.group.last_issued_member_epoch = epoch
        member = self.group.members[member_id]
        self._update_member(
            member_id,
            previous_member_epoch=member.member_epoch,
            member_epoch=epoch,
        )
        self.issued.add(member_id)
        self.observable = True

    def refresh_member_view(self, member_id: str) -> None:
        """Bump the member epoch when what the member reads or holds changed.

        Only called while handling the member's own heartbeat, so a member is at
        most one epoch behind (its answer was lost), never fenced merely because
        other members' moves changed its assignment in between.
        """
        member = self.group.members[member_id]
        assigned = self.group.assigned_to(member_id)
        holding = self.group.shards_held_by(member_id)
        if member.member_epoch == 0 or assigned != member.assigned or holding != member.holding:
            self._update_member(member_id, assigned=assigned, holding=holding)
            self._issue_epoch(member_id)

    # -- shards ------------------------------------------------------------

    def release(self, shard: int) -> None:
        if shard in self.group.owners:
            del self._owners_for_write()[shard]
            self.dirty = self.observable = True

    def may_grant(self) -> bool:
        # During a correction round Redis may have forgotten a grant whose
        # holder still reads inside its lease, so no shard moves to a new holder
        # until the round closes: at least one member lease after it began.
        # (Granting inside the round, under drain-only answers, would also hand
        # members shards they are told not to start, which they then report as
        # released: a livelock the simulation found.)
        return self.group.correction is None

    def grant_pending(self, member_id: str) -> None:
        owners = self.group.owners
        free = [s for s in self.group.pending_for(member_id) if s not in owners]
        if free:
            owners = self._owners_for_write()
            for shard in free:
                owners[shard] = member_id
            self.dirty = self.observable = True

    def rebalance(self) -> None:
        live = self.group.live_member_ids()
        target = assign(self.group.assignable_shards(), live, self.group.target)
        if target != self.group.target:
            self.group.target = target
            self.group.assignment_epoch += 1
            self.dirty = self.observable = True
        self._refresh_revoke_deadlines()

    def _refresh_revoke_deadlines(self) -> None:
        revoking: set[str] = set()
        target = self.group.target
        for shard, owner in self.group.owners.items():
            if target.get(shard) != owner:
                revoking.add(owner)
        deadline = self.now + self.config.rebalance_timeout_ms
        for member_id, member in list(self.group.members.items()):
            if not member.live:
                continue
            if member_id in revoking and member.revoke_deadline_ms is None:
                self._update_member(member_id, revoke_deadline_ms=deadline)
            elif member_id not in revoking and member.revoke_deadline_ms is not None:
                self._update_member(member_id, revoke_deadline_ms=None)

    # -- correction rounds ---------------------------------------------------

    def open_correction(self, reported_version: int) -> None:
        """Open a correction round, or restart the wait of the open one.

        Every regression signal restarts the wait: the writes Redis lost may
        postdate the round's start (a snapshot that already had a round open
        can come back), and any grant among them has a holder whose lease runs
        from then on.  The cost is a longer round while a member keeps
        reporting a version above Redis'.
        """
        # Redis lost writes, and with them the record of epochs they issued,
        # possibly by a coordinator whose clock runs ahead of this one.  Every
        # epoch from now on is above anything issued before the loss by a
        # clock up to one member lease ahead: more skew than that breaks the
        # leases first (docs/concepts.md, "Epochs never repeat").
        jump = epoch_floor(self.now + self.config.member_lease_ttl_ms)
        if self.group.last_issued_member_epoch < jump:
            self.group.last_issued_member_epoch = jump
        correction = self.group.correction
        if correction is None:
            self.group.correction = CorrectionRound(
                started_at_ms=self.now,
                stored_version=self.group.metadata_version,
                highest_reported_version=reported_version,
            )
            self.group.correction_rounds_started += 1
        else:
            self.group.correction = correction.model_copy(
                update={
                    "started_at_ms": self.now,
                    "highest_reported_version": max(
                        reported_version, correction.highest_reported_version
                    ),
                }
            )
        self.dirty = True

    def _drain_overdue(self) -> bool:
        correction = self.group.correction
        if correction is None:
            return False
        cfg = self.config
        return self.now > (
            correction.started_at_ms + cfg.member_lease_ttl_ms + cfg.rebalance_timeout_ms
        )

    def _maybe_close_correction(self) -> None:
        correction = self.group.correction
        if correction is None:
            return
        if self.now < correction.started_at_ms + self.config.member_lease_ttl_ms:
            return
        group = self.group
        # Close only once every live member applied Redis' current version.
        for member_id in group.live_member_ids():
            member = group.members[member_id]
            # A static member away for a restart holds nothing and cannot report.
            if member.static_leave_at_ms is not None:
                continue
            if member.last_reported_version != group.metadata_version:
                return
        # ...and no member may still have entries in flight on a shard Redis
        # forgot it held: once the round closes that shard can be granted.
        for member in group.members.values():
            if not member.draining_unrecorded:
                continue
            if member.live:
                return
            gone_at = (
                member.fenced_at_ms if member.fenced_at_ms is not None else member.dead_since_ms
            )
            if gone_at is not None and self.now < gone_at + self.config.member_lease_ttl_ms:
                return
        group.correction = None
        self.dirty = True

    # -- timeouts ------------------------------------------------------------

    def apply_timeouts(self) -> None:
        # ``next_timeout_ms`` is a lower bound of every deadline below, so a
        # steady heartbeat skips the O(members) scan.  Heartbeats only push a
        # member's own deadline later, which keeps the bound valid between
        # recomputations (see ``finish``).
        if self.now < self.group.next_timeout_ms:
            return
        self.timeouts_scanned = True
        cfg = self.config
        for member_id, member in list(self.group.members.items()):
            if member.live and self.now > member.last_heartbeat_ms + cfg.member_lease_ttl_ms:
                self.expire_member(member_id)
            elif (
                member.live
                and member.revoke_deadline_ms is not None
                and self.now > member.revoke_deadline_ms
            ):
                self.fence_member(member_id)
            elif member.live and member.draining_unrecorded and self._drain_overdue():
                # A drain of forgotten shards may not hold the round open for
                # ever: past the rebalance timeout the member is fenced, and
                # the round waits one more lease for its entries in flight.
                self.fence_member(member_id)
        for member_id, member in list(self.group.members.items()):
            held = self.group.shards_held_by(member_id) if not member.live else []
            if (
                member.state is MemberState.FENCED
                and held
                and member.fenced_at_ms is not None
                and self.now >= member.fenced_at_ms + cfg.member_lease_ttl_ms
            ):
                for shard in held:
                    self.release(shard)
                self._update_member(member_id, assigned=[], holding=[])
            elif (
                not member.live
                and not held
                and member.dead_since_ms is not None
                and self.now > member.dead_since_ms + cfg.dead_member_retention_ms
            ):
                del self._members_for_write()[member_id]
                self.touched.add(member_id)
                self.dirty = True
        self._maybe_close_correction()

    # -- result --------------------------------------------------------------

    def finish(self) -> GroupMetadata:
        if self.membership_changed:
            self.group.group_epoch += 1
        if self.observable:
            # Only ownership and target changes alter who must revoke; a
            # liveness-only heartbeat skips the O(shards) pass.
            self._refresh_revoke_deadlines()
        self._maybe_close_correction()
        if self.observable or self.timeouts_scanned or self.group.correction is not None:
            # Anything that can set an earlier deadline is observable (joins,
            # fences, revokes) or opens a round; recompute the bound then.
            bound = earliest_deadline_ms(self.group, self.config)
            bound = NEVER_MS if bound is None else bound
            if bound != self.group.next_timeout_ms:
                self.group.next_timeout_ms = bound
                self.dirty = True
        if not self.dirty:
            return self.original
        if self.observable:
            self.group.metadata_version += 1
            # The group state depends only on what ``observable`` covers.
            self.group.state = _derive_state(self.group)
            for member_id in self.issued & self.group.members.keys():
                self._update_member(member_id, epoch_version=self.group.metadata_version)
        self.group.updated_at_ms = self.now
        return self.group


def _derive_state(group: GroupMetadata) -> GroupState:
    if not group.live_member_ids():
        return GroupState.EMPTY
    target, owners = group.target, group.owners
    if any(target.get(shard) != owner for shard, owner in owners.items()):
        return GroupState.RECONCILING
    if any(shard not in owners for shard in target):
        return GroupState.ASSIGNING
    return GroupState.STABLE
