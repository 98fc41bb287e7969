"""Stream-wide resharding decisions as pure functions: plans the server carries out.

The shard streams of a prefix are shared by all of its consumer groups, so
provisioning, probing and retiring a shard are stream-wide decisions taken
from every group's state at once.  They are made here, over plain values and
an injected ``now``; ``streamkit_server/coordination/resharding.py`` only does the Redis
work a plan names and feeds the outcomes back through ``DrainPlan``.

The safety rules these functions hold:

* every group of the stream allocates the same new shards (else the groups'
  histories diverged and nothing is provisioned);
* nothing is probed or retired before *every* participating group's producer
  routing lease has run out since its switch (a producer of any group may
  still write to a removed shard until then);
* a shard is retired only if every group that still has it removed and
  unretired agrees it is proven drained and unheld.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streamkit.protocol import MigrationState

from .config import CoordinatorConfig
from .errors import Rejected
from .model import GroupMetadata, MigrationRecord
from .resharding import ReshardingWork, pending_work
from .streams import refuse_active

__all__ = [
    "DrainPlan",
    "ProvisionPlan",
    "active_migrations",
    "added_shards",
    "participants",
    "plan_drain",
    "plan_provisioning",
    "refuse_active",
]


@dataclass(frozen=True, slots=True)
class ProvisionPlan:
    """Finish an interrupted PREPARING migration: provision, then switch."""

    resharding_id: str
    #: Shards to provision (stream + the Redis group of every group of the stream).
    shards: tuple[int, ...]
    #: Groups whose migration switches (``complete_provisioning``) afterwards.
    complete: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DrainPlan:
    """Probe removed shards, record the proofs, retire what every group agrees on."""

    resharding_id: str
    #: Shards to probe (``XINFO GROUPS``), outside any group critical section.
    probe: tuple[int, ...]
    #: Shards to retire (re-check and delete), in this order.
    retire: tuple[int, ...]
    #: Per group: the shards whose probe result it records.
    probing: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: Per group: the shards whose retirement outcome it records.
    retiring: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def probe_results(self, drained: Mapping[int, bool]) -> dict[str, dict[int, bool]]:
        """Per group, the probe results to apply; groups with nothing proven are left out."""
        out: dict[str, dict[int, bool]] = {}
        for name, shards in self.probing.items():
            proven = {s: drained.get(s, False) for s in shards}
            if any(proven.values()):
                out[name] = proven
        return out

    def retirement_results(self, retired: Mapping[int, bool]) -> dict[str, dict[int, bool]]:
        """Per group, the retirement outcomes to apply (only shards it asked for)."""
        out: dict[str, dict[int, bool]] = {}
        for name, shards in self.retiring.items():
            outcome = {s: retired[s] for s in shards if s in retired}
            if outcome:
                out[name] = outcome
        return out


def active_migrations(groups: Iterable[GroupMetadata]) -> list[str]:
    """The resharding ids active in any of the groups, sorted."""
    return sorted({m.resharding_id for g in groups if (m := g.active_migration()) is not None})


def participants(groups: Mapping[str, GroupMetadata], rid: str) -> dict[str, GroupMetadata]:
    """The groups whose active migration is ``rid``."""
    return {
        n: g
        for n, g in groups.items()
        if (m := g.active_migration()) is not None and m.resharding_id == rid
    }


def added_shards(stream_prefix: str, rid: str, groups: Iterable[GroupMetadata]) -> list[int]:
    """The shards migration ``rid`` adds, which every group must agree on."""
    added = set()
    for group in groups:
        for migration in group.migrations:
            if migration.resharding_id == rid:
                added.add(tuple(migration.added_shards))
    return _agreed(stream_prefix, added)


def plan_provisioning(
    stream_prefix: str,
    rid: str,
    parts: Mapping[str, GroupMetadata],
    now_ms: int,
    config: CoordinatorConfig,
) -> ProvisionPlan | None:
    """What finishing an interrupted PREPARING ``rid`` takes; ``None``: nothing is PREPARING."""
    work = {n: pending_work(g, now_ms, config) for n, g in parts.items()}
    preparing = sorted(n for n, w in work.items() if w is not None and w.prepare)
    if not preparing:
        return None
    shards = _agreed(stream_prefix, {w.provision for n in preparing if (w := work[n]) is not None})
    return ProvisionPlan(rid, tuple(shards), tuple(preparing))


def plan_drain(
    rid: str, parts: Mapping[str, GroupMetadata], now_ms: int, config: CoordinatorConfig
) -> DrainPlan | None:
    """What to probe and retire for ``rid`` now; ``None``: nothing, or not yet."""
    lease = config.producer_routing_lease_ms
    for group in parts.values():
        m = _active(group, rid)
        # A producer of any group may write to a removed shard until that
        # group's routing lease has run out since it switched.
        if m.state not in (MigrationState.DRAINING, MigrationState.ROLLING_BACK):
            return None
        if m.switched_at_ms is None or now_ms < m.switched_at_ms + lease:
            return None
    works: dict[str, ReshardingWork] = {}
    for name, group in parts.items():
        work = pending_work(group, now_ms, config)
        if work is not None and work.resharding_id == rid:
            works[name] = work
    if not works:
        return None
    probe = sorted({s for w in works.values() for s in w.probe})
    retire = [
        s
        for s in sorted({s for w in works.values() for s in w.retire})
        if all(
            name in works and s in works[name].retire
            for name, group in parts.items()
            if s in (m := _active(group, rid)).removed_shards and s not in m.retired_shards
        )
    ]
    return DrainPlan(
        rid,
        tuple(probe),
        tuple(retire),
        probing={n: w.probe for n, w in works.items() if w.probe},
        retiring={n: tuple(s for s in w.retire if s in retire) for n, w in works.items()},
    )


def _active(group: GroupMetadata, rid: str) -> MigrationRecord:
    migration = group.active_migration()
    assert migration is not None and migration.resharding_id == rid
    return migration


def _agreed(stream_prefix: str, added: set[tuple[int, ...]]) -> list[int]:
    if len(added) > 1:
        # Fresh shard numbers come from each group's known shards; they agree
        # unless the groups' histories diverged.
        raise Rejected(
            "LAYOUT_DIVERGED",
            f"the groups of stream {stream_prefix!r} would add different shards {sorted(added)}",
        )
    return list(added.pop()) if added else []
