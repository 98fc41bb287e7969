"""A tiny driver for exercising the pure core one heartbeat at a time."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

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
    handle_heartbeat,
    new_group,
    tick,
)

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

    def beat(self, member_id: str, req: HeartbeatRequest, *, path_id: str | None = None) -> Answer:
        outcome = handle_heartbeat(self.group, path_id or member_id, req, self.now, self.config)
        if outcome.changed:
            assert outcome.state is not None
            self.group = outcome.state
            self.writes += 1
        else:
            assert outcome.state is self.group
        r = outcome.response
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

    def tick(self) -> None:
        self.group = tick(self.group, self.now, self.config)
