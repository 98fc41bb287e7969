"""Resharding as a Redis-recorded state machine (pure; the server does the I/O).

A migration changes a group's layout from ``from_shard_count`` to
``to_shard_count`` shards::

    PREPARING -> ACTIVE -> DRAINING -> DEPRECATED
        |          |          |
        +----------+----------+--> (rollback) ROLLING_BACK -> ROLLED_BACK

* PREPARING: the server creates the new shard streams and consumer groups;
  nothing routes to them yet.  ``complete_provisioning`` switches routing.
* ACTIVE: producers and consumers use the new layout; shards the change
  removed stay assignable so members keep reading what is in them.
* DRAINING: every producer's routing lease has run out since the switch, so
  nothing new can reach a removed shard.  The server probes each removed shard
  (``XINFO GROUPS``: every consumer group pending=0 and a known lag=0); a proven
  shard stops being assignable, its holder revokes it, and once nobody holds it
  the server retires it (checks again and deletes the key atomically).
* DEPRECATED: every removed shard is retired.  A scale-out has no removed
  shards and goes there as soon as the producer lease has passed.
* Rollback is allowed until the first shard is retired: the layout switches
  back and the shards the migration added are drained the same way.

When every member has expired the revoke step is vacuous (nobody holds the
shard), so completion waits only for the Redis-level drain proof.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from streamkit.protocol import MigrationState

from .config import CoordinatorConfig
from .draft import Draft
from .errors import Rejected
from .model import GroupMetadata, MigrationRecord
from .result import Result, result_of


class ReshardingRejected(Rejected):
    """A resharding request the current state does not allow."""


@dataclass(frozen=True, slots=True)
class ReshardingWork:
    """The Redis work a migration waits for, for the server to carry out."""

    resharding_id: str
    #: The migration is PREPARING: provision ``provision`` (possibly none, for a
    #: scale-in), then call ``complete_provisioning``.
    prepare: bool = False
    #: Shards to provision: create the stream and the consumer groups.
    provision: tuple[int, ...] = ()
    #: Removed shards to probe for the drain proof.
    probe: tuple[int, ...] = ()
    #: Proven, unheld shards to retire (re-check and delete).
    retire: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReshardingSpec:
    """One scale of a stream, as each of its groups records it (``start_resharding``)."""

    resharding_id: str
    target_shard_count: int
    #: Who asked and why (the audit trail of the migration record).
    requested_by: str | None = None
    reason: str | None = None
    #: Keep per-key order: the new shards are read only once the old ones are drained.
    ordered: bool = False
    #: Shard numbers new shards must not take.  New shards get the lowest
    #: numbers that neither the group nor ``avoid`` uses: the server passes
    #: every shard any group of the stream knows, so all groups of a stream
    #: allocate the same numbers.
    avoid: Collection[int] = ()


def start_resharding(
    group: GroupMetadata,
    spec: ReshardingSpec,
    now_ms: int,
    config: CoordinatorConfig | None = None,
) -> Result[GroupMetadata]:
    """Record a PREPARING migration to ``spec.target_shard_count`` shards."""
    target = spec.target_shard_count
    if target < 0:
        raise ReshardingRejected("INVALID_TARGET_SHARD_COUNT", "targetShardCount must be 0 or more")
    if group.active_migration() is not None:
        raise ReshardingRejected(
            "ACTIVE_MIGRATION_EXISTS",
            f"{group.stream_prefix}/{group.consumer_group} already has an active migration",
        )
    if target == group.shard_count and not spec.ordered:
        raise ReshardingRejected("SHARD_COUNT_UNCHANGED", f"the stream already has {target} shards")
    layout = group.layout
    if spec.ordered:
        # Children get shards of their own: none of the parents' streams is
        # reused, so "every parent drained" is a per-stream fact.
        added = _fresh_shards(group, target, spec.avoid)
        new_layout, removed = added, list(layout)
    elif target > group.shard_count:
        added = _fresh_shards(group, target - group.shard_count, spec.avoid)
        new_layout, removed = [*layout, *added], []
    else:
        added, new_layout, removed = [], layout[:target], layout[target:]
    record = MigrationRecord(
        resharding_id=spec.resharding_id,
        from_shard_count=group.shard_count,
        to_shard_count=target,
        state=MigrationState.PREPARING,
        created_at_ms=now_ms,
        updated_at_ms=now_ms,
        requested_by=spec.requested_by,
        reason=spec.reason,
        previous_layout=list(layout),
        new_layout=new_layout,
        added_shards=added,
        removed_shards=removed,
        ordered=spec.ordered,
    )
    draft = Draft(group, now_ms, config or CoordinatorConfig())
    draft.group.migrations = [*group.migrations, record]
    draft.dirty = draft.observable = True
    return finished(draft)


def pending_work(
    group: GroupMetadata, now_ms: int, config: CoordinatorConfig
) -> ReshardingWork | None:
    migration = group.active_migration()
    if migration is None:
        return None
    if migration.state is MigrationState.PREPARING:
        return ReshardingWork(
            migration.resharding_id, prepare=True, provision=tuple(migration.added_shards)
        )
    if migration.state not in (MigrationState.DRAINING, MigrationState.ROLLING_BACK):
        return None
    if not _producer_lease_passed(migration, now_ms, config):
        return None
    draining = set(group.draining_shards)
    held = set(group.owners)
    retired = set(migration.retired_shards)
    probe = tuple(s for s in migration.removed_shards if s in draining)
    retire = tuple(
        s
        for s in migration.removed_shards
        if s not in draining and s not in held and s not in retired
    )
    if not probe and not retire:
        return None
    return ReshardingWork(migration.resharding_id, probe=probe, retire=retire)


def complete_provisioning(
    group: GroupMetadata, resharding_id: str, now_ms: int, config: CoordinatorConfig
) -> Result[GroupMetadata]:
    """New shards exist in Redis: route to the new layout."""
    draft, migration = _opened(group, resharding_id, now_ms, config)
    if migration.state is not MigrationState.PREPARING:
        return Result(group, (), group)  # a retry after the switch was already recorded
    held = migration.added_shards if migration.ordered else []
    _switch_layout(draft, migration.new_layout, migration.removed_shards, held)
    _update_migration(draft, resharding_id, state=MigrationState.ACTIVE, switched_at_ms=now_ms)
    return finished(draft)


def fail_provisioning(
    group: GroupMetadata, resharding_id: str, now_ms: int, config: CoordinatorConfig
) -> Result[GroupMetadata]:
    """Provisioning failed before anything was routed: the migration ends."""
    draft, migration = _opened(group, resharding_id, now_ms, config)
    if migration.state is MigrationState.PREPARING:
        _update_migration(draft, resharding_id, state=MigrationState.ROLLED_BACK)
    return finished(draft)


def apply_drain_probe(
    group: GroupMetadata,
    resharding_id: str,
    drained: Mapping[int, bool],
    now_ms: int,
    config: CoordinatorConfig,
) -> Result[GroupMetadata]:
    """Record which removed shards Redis proved drained.

    A proven shard stops being assignable: its holder is asked to revoke it
    (there is nothing left to read) and the next round retires it.
    """
    draft, migration = _opened(group, resharding_id, now_ms, config)
    proven = _reported(migration, drained, True)
    if proven & set(draft.group.draining_shards):
        _set_draining(draft, set(draft.group.draining_shards) - proven)
    return finished(draft)


def apply_retirement(
    group: GroupMetadata,
    resharding_id: str,
    retired: Mapping[int, bool],
    now_ms: int,
    config: CoordinatorConfig,
) -> Result[GroupMetadata]:
    """Record the outcome of retiring shards.

    ``True``: Redis re-checked the drain proof and deleted the key (or it was
    already gone).  ``False``: new entries appeared, so the shard becomes
    assignable again and is drained once more.
    """
    draft, migration = _opened(group, resharding_id, now_ms, config)
    done = _reported(migration, retired, True)
    again = _reported(migration, retired, False)
    if again:
        _set_draining(draft, set(draft.group.draining_shards) | again)
    if done:
        _update_migration(
            draft, resharding_id, retired_shards=sorted(set(migration.retired_shards) | done)
        )
    advance_migration(draft)
    return finished(draft)


def rollback_resharding(
    group: GroupMetadata, resharding_id: str, now_ms: int, config: CoordinatorConfig
) -> Result[GroupMetadata]:
    draft, migration = _opened(group, resharding_id, now_ms, config)
    if migration.state is MigrationState.PREPARING:
        # Nothing was routed yet: the same end as a failed provisioning.
        return fail_provisioning(group, resharding_id, now_ms, config)
    if (
        migration.state not in (MigrationState.ACTIVE, MigrationState.DRAINING)
        or migration.retired_shards
    ):
        raise ReshardingRejected(
            "ROLLBACK_NOT_ALLOWED",
            f"migration {resharding_id} is {migration.state.value}"
            + (" and has retired shards" if migration.retired_shards else "")
            + "; it can no longer be rolled back",
        )
    # Shards the migration was draining go back to being ordinary shards, and
    # the ones it added are drained instead (producers may have written there).
    draft.group.draining_shards = sorted(
        set(draft.group.draining_shards) - set(migration.removed_shards)
    )
    draft.group.held_shards = sorted(set(draft.group.held_shards) - set(migration.added_shards))
    _switch_layout(draft, migration.previous_layout, migration.added_shards, [])
    _update_migration(
        draft,
        resharding_id,
        state=MigrationState.ROLLING_BACK,
        switched_at_ms=now_ms,
        removed_shards=migration.added_shards,
        added_shards=[],
        retired_shards=[],
    )
    advance_migration(draft)
    return finished(draft)


def finished(draft: Draft) -> Result[GroupMetadata]:
    """The ``Result`` of a resharding step: it answers the group after it."""
    result = result_of(draft.original, draft.finish(), None)
    assert result.state is not None
    return Result(result.state, result.changes, result.state)


def advance_migration(draft: Draft) -> None:
    """Time- and progress-driven transitions; called from the tick too."""
    migration = draft.group.active_migration()
    if migration is None:
        return
    now, config = draft.now, draft.config
    if migration.state is MigrationState.ACTIVE and _producer_lease_passed(migration, now, config):
        _update_migration(draft, migration.resharding_id, state=MigrationState.DRAINING)
        migration = draft.group.active_migration()
        assert migration is not None
    if migration.state in (MigrationState.DRAINING, MigrationState.ROLLING_BACK):
        if set(migration.retired_shards) >= set(migration.removed_shards):
            final = (
                MigrationState.DEPRECATED
                if migration.state is MigrationState.DRAINING
                else MigrationState.ROLLED_BACK
            )
            _update_migration(draft, migration.resharding_id, state=final)
            if set(draft.group.held_shards) & set(migration.added_shards):
                # Ordered mode: every parent is drained and gone, so the
                # children may be read now.
                draft.group.held_shards = sorted(
                    set(draft.group.held_shards) - set(migration.added_shards)
                )
                _shards_changed(draft)


def _producer_lease_passed(
    migration: MigrationRecord, now_ms: int, config: CoordinatorConfig
) -> bool:
    return (
        migration.switched_at_ms is not None
        and now_ms >= migration.switched_at_ms + config.producer_routing_lease_ms
    )


def _switch_layout(draft: Draft, layout: list[int], removed: list[int], held: list[int]) -> None:
    draft.group.layout = list(layout)
    draft.group.shard_count = len(layout)
    draft.group.draining_shards = sorted(set(draft.group.draining_shards) | set(removed))
    draft.group.held_shards = sorted(set(draft.group.held_shards) | set(held))
    _shards_changed(draft)


def _shards_changed(draft: Draft) -> None:
    """Which shards may be assigned changed: saved, shown, and rebalanced at once."""
    draft.dirty = draft.observable = draft.membership_changed = True
    draft.rebalance()


def _reported(migration: MigrationRecord, outcomes: Mapping[int, bool], ok: bool) -> set[int]:
    """The shards Redis answered ``ok`` for, among those the migration removes: an
    answer about any other shard does not concern this migration and changes nothing."""
    return {s for s, result in outcomes.items() if result == ok and s in migration.removed_shards}


def _set_draining(draft: Draft, shards: set[int]) -> None:
    """``shards`` are the ones being drained from now on (none of them assignable)."""
    draft.group.draining_shards = sorted(shards)
    _shards_changed(draft)


def _fresh_shards(group: GroupMetadata, count: int, avoid: Collection[int]) -> list[int]:
    """The lowest shard numbers no stream of the group uses: keeps a plain
    layout the identity ``0..n-1`` that pattern-based clients expect."""
    taken = group.known_shards() | set(avoid)
    fresh: list[int] = []
    candidate = 0
    while len(fresh) < count:
        if candidate not in taken:
            fresh.append(candidate)
        candidate += 1
    return fresh


def _opened(
    group: GroupMetadata, resharding_id: str, now_ms: int, config: CoordinatorConfig
) -> tuple[Draft, MigrationRecord]:
    """A draft of ``group`` and its migration ``resharding_id`` (refused if none)."""
    draft = Draft(group, now_ms, config)
    return draft, _migration(draft, resharding_id)


def _migration(draft: Draft, resharding_id: str) -> MigrationRecord:
    for migration in draft.group.migrations:
        if migration.resharding_id == resharding_id:
            return migration
    raise ReshardingRejected("MIGRATION_NOT_FOUND", f"no migration {resharding_id} for this group")


def _update_migration(draft: Draft, resharding_id: str, **changes: object) -> None:
    changes["updated_at_ms"] = draft.now
    draft.group.migrations = [
        m.model_copy(update=changes) if m.resharding_id == resharding_id else m
        for m in draft.group.migrations
    ]
    draft.dirty = draft.observable = True
