"""A tiny driver for exercising the pure core one operation at a time.

Every operation goes through ``Harness.apply``, which persists the result the
way the store does: it replays ``changes`` onto the stored group (member
records one by one, the document only on a document change) and checks that
the replayed group is exactly the operation's ``state``.  An operation whose
changes miss something it changed fails here, before any Redis is involved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from streamkit.protocol import (
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatStatus,
    RevokingShardReport,
    RevokingShardState,
    RuntimeConsumerCapacity,
    ShardId,
    shard_ids,
    shard_indexes,
)
from streamkit_server.core import (
    CoordinatorConfig,
    GroupMetadata,
    MemberRemoved,
    MemberUpserted,
    ReshardingSpec,
    Result,
    apply_drain_probe,
    apply_retirement,
    complete_provisioning,
    fail_provisioning,
    handle_heartbeat,
    new_group,
    rollback_resharding,
    start_resharding,
    steady,
    tick,
)

R = TypeVar("R")

CONFIG = CoordinatorConfig(
    heartbeat_interval_ms=100,
    member_lease_ttl_ms=1_000,
    rebalance_timeout_ms=5_000,
    producer_routing_lease_ms=500,
)


def request(
    member_id: str,
    epoch: int,
    *,
    owned: Iterable[int] = (),
    draining: Iterable[int] = (),
    revoked: Iterable[int] = (),
    in_flight: int = 0,
    version: int = 0,
    protocol_version: int = 1,
    body_member_id: str | None = None,
    request_id: str = "r",
    incarnation: str | None = None,
) -> HeartbeatRequest:
    reports = [
        RevokingShardReport(
            shard=ShardId(shard_index=s), state=RevokingShardState.DRAINING, in_flight=1
        )
        for s in draining
    ] + [
        RevokingShardReport(
            shard=ShardId(shard_index=s), state=RevokingShardState.REVOKED, in_flight=in_flight
        )
        for s in revoked
    ]
    return HeartbeatRequest(
        protocol_version=protocol_version,
        request_id=request_id,
        member_id=body_member_id or member_id,
        member_epoch=epoch,
        metadata_version=version,
        runtime_consumer_capacity=RuntimeConsumerCapacity(
            runtime_max_concurrency=1, available_concurrency=1
        ),
        owned_shards=shard_ids(owned),
        revoking_shards=reports,
        incarnation=incarnation,
    )


def replay(stored: GroupMetadata, result: Result[Any]) -> GroupMetadata:
    """What the store holds after writing ``result.changes`` over ``stored``."""
    state = result.state
    assert state is not None
    members = dict(stored.members)
    for change in result.changes:
        if isinstance(change, MemberUpserted):
            assert state.members[change.member.member_id] is change.member
            members[change.member.member_id] = change.member
        elif isinstance(change, MemberRemoved):
            members.pop(change.member_id, None)
    # A member-only write leaves the document (and its stamp) as stored.
    document = stored if steady(result.changes) else state
    return document.model_copy(update={"members": members})


@dataclass
class Answer:
    status: HeartbeatStatus
    epoch: int
    assigned: list[int]
    pending: list[int]
    version: int
    raw: HeartbeatResponse


@dataclass
class Harness:
    """Holds the stored group and a clock; every call stores what the core wrote."""

    group: GroupMetadata = field(default_factory=lambda: new_group("orders", "billing", 4, 0))
    now: int = 0
    config: CoordinatorConfig = CONFIG
    writes: int = 0

    def apply(self, result: Result[R]) -> R:
        """Persist ``result`` like the service does; its response."""
        if result.changed:
            assert result.state is not None
            stored = replay(self.group, result)
            assert stored.model_dump() == result.state.model_dump(), "changes miss a write"
            self.group = result.state
            self.writes += 1
        else:
            assert result.state is self.group
        return result.response

    def beat(self, member_id: str, req: HeartbeatRequest, *, path_id: str | None = None) -> Answer:
        r = self.apply(
            handle_heartbeat(self.group, path_id or member_id, req, self.now, self.config)
        )
        assert r.assignment is not None and r.status is not None
        return Answer(
            status=r.status,
            epoch=int(r.member_epoch or 0),
            assigned=shard_indexes(r.assignment.assigned_shards),
            pending=shard_indexes(r.assignment.pending_shards),
            version=int(r.metadata_version or 0),
            raw=r,
        )

    def join(self, member_id: str) -> Answer:
        return self.beat(member_id, request(member_id, 0, version=self.group.metadata_version))

    def steady(
        self,
        member_id: str,
        answer: Answer,
        *,
        draining: Iterable[int] = (),
        revoked: Iterable[int] = (),
    ) -> Answer:
        """A well-behaved member's next heartbeat after ``answer``."""
        gone = set(draining) | set(revoked)
        owned = [s for s in answer.assigned if s not in gone]
        return self.beat(
            member_id,
            request(
                member_id,
                answer.epoch,
                owned=owned,
                draining=draining,
                revoked=revoked,
                version=answer.version,
            ),
        )

    def advance(self, ms: int) -> None:
        self.now += ms

    def tick(self) -> bool:
        """Apply what is due; whether anything was."""
        return self.apply(tick(self.group, self.now, self.config))

    # -- resharding steps: each answers the group after it ----------------------------

    def start(self, target: int, rid: str, **kw: object) -> GroupMetadata:
        return self.apply(
            start_resharding(
                self.group,
                ReshardingSpec(resharding_id=rid, target_shard_count=target, **kw),  # type: ignore[arg-type]
                self.now,
            )
        )

    def complete(self, rid: str) -> GroupMetadata:
        return self.apply(complete_provisioning(self.group, rid, self.now, self.config))

    def fail(self, rid: str) -> GroupMetadata:
        return self.apply(fail_provisioning(self.group, rid, self.now, self.config))

    def probed(self, rid: str, drained: Mapping[int, bool]) -> GroupMetadata:
        return self.apply(apply_drain_probe(self.group, rid, drained, self.now, self.config))

    def retired(self, rid: str, retired: Mapping[int, bool]) -> GroupMetadata:
        return self.apply(apply_retirement(self.group, rid, retired, self.now, self.config))

    def rollback(self, rid: str) -> GroupMetadata:
        return self.apply(rollback_resharding(self.group, rid, self.now, self.config))
