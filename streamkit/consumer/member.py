"""The member side of the protocol as a sans-IO state machine.

One ``MemberStateMachine`` per logical coordinator member.  The consumer
runtime asks it for the next heartbeat request, hands it the response (or the
failure), and reads back which shards may be read, which must be drained, and
which were lost.  It never does I/O and never reads a clock: every method that
needs time takes ``now_ms`` from a monotonic clock the caller owns.

Safety rules it enforces (the member side of the protocol, docs/concepts.md):

* a shard is readable only if an ``OK`` response assigned it and the local
  assignment lease, counted from when the request was *sent*, has not run out;
  the coordinator records liveness no earlier than that, so the local lease
  always ends before the coordinator could expire the member;
* ``SYNC_METADATA`` / ``REVOKE_PENDING`` are drain-only: keep already-read
  shards that remain assigned, start nothing new;
* a shard removed from the assignment is drained and reported ``REVOKED``; a
  failed heartbeat never resumes it; only a later assignment does;
* ``UNKNOWN_MEMBER_ID`` / ``FENCED_MEMBER_EPOCH`` drop everything and rejoin
  with epoch 0 and empty ownership.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from streamkit.protocol import (
    LEAVE_EPOCH,
    PROTOCOL_VERSION,
    STATIC_LEAVE_EPOCH,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatStatus,
    RevokingShardReport,
    RevokingShardState,
    RuntimeConsumerCapacity,
    ShardConsumptionProgress,
    ShardId,
    shard_ids,
    shard_indexes,
)

#: Without a configured lease, a member reads for two heartbeat intervals after
#: a successful heartbeat.  The coordinator refuses a member lease TTL shorter
#: than two intervals, so this default can never outlive the server's lease.
DEFAULT_LEASE_INTERVALS = 2


def new_incarnation() -> str:
    """A token for one start of a process: no other process draws the same."""
    return secrets.token_hex(8)


class ReactionKind(StrEnum):
    START = "start"  # begin reading these shards (claim their pending entries first)
    DRAIN = "drain"  # stop new reads, finish in-flight work, then call drained()
    LOST = "lost"  # fenced or forgotten: stop at once, nothing to report
    REJECTED = "rejected"  # the coordinator refused the request (bad protocol or body)


class MemberPhase(StrEnum):
    """The member's local phase (metrics, status); not the coordinator's member state."""

    JOINING = "joining"  # no epoch yet (first join, or rejoining after a fence)
    STABLE = "stable"  # joined, nothing being given back
    RECONCILING = "reconciling"  # joined, draining or reporting revoked shards
    STOPPING = "stopping"  # shutting down: draining, then leaving
    LEFT = "left"


@dataclass(frozen=True, slots=True)
class Reaction:
    kind: ReactionKind
    shards: frozenset[int] = frozenset()
    status: HeartbeatStatus | None = None


@dataclass(slots=True)
class _Sent:
    request_id: str
    sent_at_ms: int
    revoked: frozenset[int]


@dataclass
class MemberStateMachine:
    member_id: str
    member_name: str | None = None
    #: Local assignment lease; must not exceed the coordinator's member lease TTL.
    lease_ms: int | None = None
    protocol_version: int = PROTOCOL_VERSION
    #: This start's token, sent with every request (see ``new_incarnation``).
    incarnation: str | None = None
    #: Static membership: a graceful stop leaves with epoch -2, keeping the
    #: shards reserved for the restart of the same member id.
    static: bool = False

    epoch: int = 0
    #: The metadata version to report: the highest seen, except that a
    #: SYNC_METADATA answer replaces it with Redis' current version.
    metadata_version: int = 0
    #: The highest version ever observed in this process (for rollback alerts).
    highest_observed_version: int = 0
    heartbeat_interval_ms: int = 3_000
    reading: set[int] = field(default_factory=set)
    draining: set[int] = field(default_factory=set)
    #: Drained shards not yet acknowledged by an answer to a request reporting them.
    revoked: set[int] = field(default_factory=set)
    pending: set[int] = field(default_factory=set)
    lease_until_ms: int | None = None
    last_status: HeartbeatStatus | None = None
    left: bool = False
    #: Set by ``stop()``: a member shutting down starts no shard again, even
    #: when an OK answer still assigns it (it leaves once drained).
    stopping: bool = False
    _sent: _Sent | None = None
    _sequence: int = 0

    # -- queries -------------------------------------------------------------

    def readable(self, now_ms: int) -> frozenset[int]:
        """Shards that may be read right now."""
        return frozenset(self.reading) if self.lease_valid(now_ms) else frozenset()

    def may_read(self, shard: int, now_ms: int) -> bool:
        return shard in self.reading and self.lease_valid(now_ms)

    def lease_remaining_ms(self, now_ms: int) -> int:
        """How long reads stay allowed without another answer (0 when none)."""
        if self.lease_until_ms is None:
            return 0
        return max(0, self.lease_until_ms - now_ms)

    def lease_valid(self, now_ms: int) -> bool:
        return self.lease_until_ms is not None and now_ms < self.lease_until_ms

    @property
    def joined(self) -> bool:
        return self.epoch > 0

    @property
    def state(self) -> MemberPhase:
        """Where the member stands, for metrics and status (one of ``MemberPhase``)."""
        if self.left:
            return MemberPhase.LEFT
        if self.stopping:
            return MemberPhase.STOPPING
        if not self.joined:
            return MemberPhase.JOINING
        if self.draining or self.revoked:
            return MemberPhase.RECONCILING
        return MemberPhase.STABLE

    # -- requests ------------------------------------------------------------

    def next_request(
        self,
        now_ms: int,
        *,
        in_flight: Mapping[int, int] | None = None,
        capacity: RuntimeConsumerCapacity | None = None,
        progress: list[ShardConsumptionProgress] | None = None,
    ) -> HeartbeatRequest:
        """Build the next heartbeat and remember when it was sent."""
        in_flight = in_flight or {}
        revoking = [
            RevokingShardReport(
                shard=ShardId(shard_index=s),
                state=RevokingShardState.DRAINING,
                in_flight=in_flight.get(s, 0),
            )
            for s in sorted(self.draining)
        ]
        revoking.extend(
            RevokingShardReport(
                shard=ShardId(shard_index=s), state=RevokingShardState.REVOKED, in_flight=0
            )
            for s in sorted(self.revoked)
        )
        owned = sorted(self.reading) if self.epoch > 0 else []
        request = self._request(
            self.epoch,
            owned,
            revoking if self.epoch > 0 else [],
            capacity,
            progress if self.epoch > 0 else [],
        )
        self._sent = _Sent(request.request_id, now_ms, frozenset(self.revoked))
        return request

    def leave_request(self, now_ms: int, *, for_restart: bool = True) -> HeartbeatRequest:
        """The graceful leave (memberEpoch -1, or -2 for a static member that
        stops to restart); send it after draining everything.

        ``for_restart=False``: the shards should move on now even for a static
        member (it gives them up because it cannot read them).
        """
        static = self.static and self.incarnation and for_restart
        epoch = STATIC_LEAVE_EPOCH if static else LEAVE_EPOCH
        request = self._request(epoch, [], [], None, [])
        self._sent = _Sent(request.request_id, now_ms, frozenset())
        return request

    def _request(
        self,
        epoch: int,
        owned: list[int],
        revoking: list[RevokingShardReport],
        capacity: RuntimeConsumerCapacity | None,
        progress: list[ShardConsumptionProgress] | None,
    ) -> HeartbeatRequest:
        self._sequence += 1
        return HeartbeatRequest(
            protocol_version=self.protocol_version,
            request_id=f"{self.member_id}:{self._sequence}",
            member_id=self.member_id,
            member_name=self.member_name,
            member_epoch=epoch,
            metadata_version=self.metadata_version,
            runtime_consumer_capacity=capacity
            or RuntimeConsumerCapacity(runtime_max_concurrency=1, available_concurrency=1),
            owned_shards=shard_ids(owned),
            revoking_shards=revoking,
            shard_progress=progress or [],
            incarnation=self.incarnation,
        )

    # -- local progress ----------------------------------------------------------

    def drained(self, shard: int) -> None:
        """The runtime finished all in-flight work of a draining shard."""
        if shard in self.draining:
            self.draining.discard(shard)
            self.revoked.add(shard)

    def stop(self) -> frozenset[int]:
        """Stop reading everything (shutdown): all read shards start draining."""
        self.stopping = True
        stopped = frozenset(self.reading)
        self.draining |= self.reading
        self.reading.clear()
        return stopped

    def start_over(self) -> None:
        """Forget all ownership and join again with epoch 0, like a new member.

        For a member that left on purpose without shutting down (its Redis was
        unreachable): whatever it still drained is abandoned, and the next
        request is a join.
        """
        self._lose(HeartbeatStatus.UNKNOWN_MEMBER_ID)
        self.stopping = False
        self.left = False
        self._sent = None
        if self.incarnation is not None:
            # A new incarnation: a late duplicate of the leave just sent must
            # not count as a leave of the member that joins again.
            self.incarnation = new_incarnation()

    # -- responses -------------------------------------------------------------

    def request_failed(self) -> None:
        """The request or its answer was lost.  Nothing changes: draining shards
        keep draining and the lease keeps running down."""
        self._sent = None

    def on_response(self, response: HeartbeatResponse) -> list[Reaction]:
        sent = self._sent
        if sent is None or response.response_to != sent.request_id:
            return []  # an answer to a request we gave up on: ignore it
        self._sent = None
        status = response.status
        self.last_status = status
        if response.heartbeat_interval_ms:
            self.heartbeat_interval_ms = int(response.heartbeat_interval_ms)
        if response.metadata_version is not None:
            self.highest_observed_version = max(
                self.highest_observed_version, response.metadata_version
            )

        if status in (HeartbeatStatus.UNKNOWN_MEMBER_ID, HeartbeatStatus.FENCED_MEMBER_EPOCH):
            return self._lose(status)
        if status in (HeartbeatStatus.UNSUPPORTED_PROTOCOL, HeartbeatStatus.INVALID_REQUEST):
            return [Reaction(ReactionKind.REJECTED, status=status)]
        if status not in (
            HeartbeatStatus.OK,
            HeartbeatStatus.SYNC_METADATA,
            HeartbeatStatus.REVOKE_PENDING,
        ):
            return []  # RETRY or unknown: same as a failed request
        if response.member_epoch is not None and response.member_epoch < 0:
            self.left = True
            self.epoch = 0
            self.lease_until_ms = None
            return []

        assignment = response.assignment
        assigned = set(shard_indexes(assignment.assigned_shards)) if assignment else set()
        self.pending = set(shard_indexes(assignment.pending_shards)) if assignment else set()
        if response.member_epoch is not None:
            self.epoch = int(response.member_epoch)
        if response.metadata_version is not None:
            if status is HeartbeatStatus.SYNC_METADATA:
                # Redis is the truth even when it is behind what we saw.
                self.metadata_version = response.metadata_version
            else:
                self.metadata_version = max(self.metadata_version, response.metadata_version)
        # The coordinator has seen the REVOKED reports this request carried.
        self.revoked -= sent.revoked

        reactions: list[Reaction] = []
        removed = self.reading - assigned
        if removed:
            self.reading -= removed
            self.draining |= removed
            reactions.append(Reaction(ReactionKind.DRAIN, frozenset(removed), status))
        if status is HeartbeatStatus.OK and not self.stopping:
            started = assigned - self.reading
            # A shard we were draining may come back: the coordinator only
            # assigns a shard this member still holds or that is free.
            self.draining -= started
            self.revoked -= started
            self.reading |= started
            if started:
                reactions.append(Reaction(ReactionKind.START, frozenset(started), status))
        lease = self.lease_ms or DEFAULT_LEASE_INTERVALS * self.heartbeat_interval_ms
        self.lease_until_ms = sent.sent_at_ms + lease
        return reactions

    def _lose(self, status: HeartbeatStatus) -> list[Reaction]:
        lost = frozenset(self.reading | self.draining)
        self.reading.clear()
        self.draining.clear()
        self.revoked.clear()
        self.pending.clear()
        self.epoch = 0
        self.lease_until_ms = None
        return [Reaction(ReactionKind.LOST, lost, status)]
