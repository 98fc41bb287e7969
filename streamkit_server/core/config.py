"""Protocol tunables the sans-IO core needs; the server settings map onto this."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    heartbeat_interval_ms: int = 3_000
    member_lease_ttl_ms: int = 15_000
    rebalance_timeout_ms: int = 60_000
    min_protocol_version: int = 1
    max_protocol_version: int = 1
    # The longest routing-cache lease any producer uses.  After a layout
    # change no producer can still write to a removed shard once this has
    # passed, which is what makes a drain check final.
    producer_routing_lease_ms: int = 30_000
    # How long records of expired, fenced or departed members stay visible to
    # monitoring after they stopped owning anything.
    dead_member_retention_ms: int = 300_000
    # Live members one group may have; a join beyond it is refused (400), so a
    # caller cannot make every heartbeat of the group arbitrarily expensive.
    max_members_per_group: int = 1_024

    def __post_init__(self) -> None:
        if self.heartbeat_interval_ms <= 0:
            raise ValueError("heartbeat_interval_ms must be positive")
        # A member must get several chances to heartbeat inside its lease, or a
        # single lost request would expire it.
        if self.member_lease_ttl_ms < 2 * self.heartbeat_interval_ms:
            raise ValueError("member_lease_ttl_ms must be at least twice heartbeat_interval_ms")
        if self.rebalance_timeout_ms <= 0:
            raise ValueError("rebalance_timeout_ms must be positive")
        # A member learns of a revocation only at its next heartbeat, and a
        # member that rejoined learns that its old shards were released at the
        # one after: with a shorter timeout it is fenced before it can answer,
        # rejoins, and is fenced again, and its group never settles.
        if self.rebalance_timeout_ms < 2 * self.heartbeat_interval_ms:
            raise ValueError("rebalance_timeout_ms must be at least twice heartbeat_interval_ms")
        if self.max_members_per_group < 1:
            raise ValueError("max_members_per_group must be at least 1")
        if self.min_protocol_version > self.max_protocol_version:
            raise ValueError("min_protocol_version must not exceed max_protocol_version")
