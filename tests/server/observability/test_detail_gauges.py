"""Per-shard and per-member gauges: values from metadata and samples, and the
cardinality cap at 10,000 shards (plain values, no Redis)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from streamkit_server.core.autoscaling import GroupSample, ShardSample
from streamkit_server.core.model import MemberMetadata, MemberState, new_group
from streamkit_server.observability.detail_gauges import FAMILIES, DetailGauges, families

NOW = 100_000


def group_of(shards: int, members: int = 3) -> object:
    group = new_group("orders", "billing", shards, 0)
    live = {
        f"m{i}": MemberMetadata(
            member_id=f"m{i}", state=MemberState.ACTIVE, last_heartbeat_ms=NOW - 1_000 * i
        )
        for i in range(members)
    }
    live["gone"] = MemberMetadata(member_id="gone", state=MemberState.EXPIRED)
    target = {s: f"m{s % members}" for s in range(shards)}
    owners = dict(target)
    owners[1] = "m0"  # shard 1 targets m1 but m0 still holds it: revoking
    del owners[2]  # shard 2 targets m2, nobody holds it: pending
    return group.model_copy(
        update={"members": live, "target": target, "owners": owners, "layout": list(range(shards))}
    )


def samples_for(shards: int) -> GroupSample:
    return GroupSample(NOW, tuple(ShardSample(s, s * 10, s, s * 20) for s in range(shards)))


def by_name(out: list) -> dict[str, list]:
    return {f.name: f.samples for f in out}


def test_values_of_a_small_group() -> None:
    group = group_of(4)
    out = by_name(families({("orders", "billing"): group}, {("orders", "billing"): samples_for(4)},
                           NOW, 15_000, cap=2_000))  # fmt: skip
    states = {
        s.labels["shard"]: s.labels["state"] for s in out["redis_stream_coord_shard_owner_state"]
    }
    assert states == {"0": "owned", "1": "revoking", "2": "pending", "3": "owned"}
    lag = {s.labels["shard"]: s.value for s in out["redis_stream_coord_shard_lag"]}
    assert lag == {"0": 0, "1": 10, "2": 20, "3": 30}
    age = {s.labels["member_id"]: s.value
           for s in out["redis_stream_coord_member_last_heartbeat_age_seconds"]}  # fmt: skip
    assert age == {"m0": 0.0, "m1": 1.0, "m2": 2.0}  # the expired member has no series
    left = {s.labels["member_id"]: s.value
            for s in out["redis_stream_coord_member_lease_remaining_seconds"]}  # fmt: skip
    assert left == {"m0": 15.0, "m1": 14.0, "m2": 13.0}
    revoking = {s.labels["member_id"]: s.value
                for s in out["redis_stream_coord_member_revoking_shards"]}  # fmt: skip
    assert revoking == {"m0": 1, "m1": 0, "m2": 0}
    assert all(s.value == 0 for s in out["redis_stream_coord_metric_series_dropped"])


def test_the_cap_holds_at_10000_shards_and_keeps_the_worst() -> None:
    shards, cap = 10_000, 2_000
    gauges = DetailGauges(cap=cap, lease_ttl_ms=15_000, clock_ms=lambda: NOW)
    gauges.observe_group(group_of(shards, members=5_000))
    gauges.observe_sample("orders", "billing", samples_for(shards), 12.5)
    registry = CollectorRegistry()
    registry.register(gauges)
    out = by_name(list(registry.collect()))
    for name in FAMILIES:
        assert len(out[name]) == cap, name
    dropped = {s.labels["family"]: s.value for s in out["redis_stream_coord_metric_series_dropped"]}
    assert dropped["redis_stream_coord_shard_lag"] == shards - cap
    assert dropped["redis_stream_coord_member_lease_remaining_seconds"] == 5_000 - cap
    # The kept lag series are the largest lags; the revoking and pending shards stay.
    kept = sorted(s.value for s in out["redis_stream_coord_shard_lag"])
    assert kept[0] == (shards - cap) * 10 and kept[-1] == (shards - 1) * 10
    states = {
        s.labels["shard"]: s.labels["state"] for s in out["redis_stream_coord_shard_owner_state"]
    }
    assert states["1"] == "revoking" and states["2"] == "pending"
    oldest = max(s.value for s in out["redis_stream_coord_member_last_heartbeat_age_seconds"])
    assert oldest == 4_999.0
    text = generate_latest(registry).decode()
    assert text.count("\nredis_stream_coord_shard_pending{") == cap
    # The group-level figures are one series per group, whatever the cap.
    assert 'redis_stream_coord_group_handled_per_second{consumer_group="billing",' in text
    assert "redis_stream_coord_group_shards{" in text


def test_cap_zero_exports_no_detail_series_and_deleted_groups_drop_theirs() -> None:
    gauges = DetailGauges(cap=0, clock_ms=lambda: NOW)
    gauges.observe_group(group_of(4))
    out = by_name(list(gauges.collect()))
    assert all(out[name] == [] for name in FAMILIES)
    gauges.cap = 10
    gauges.forget_except(set())
    assert all(by_name(list(gauges.collect()))[name] == [] for name in FAMILIES)
