"""Resharding, server side: the I/O around ``core.resharding``.

The shard streams of a prefix are shared by all of its consumer groups, so a
scale is a stream-wide change: every group of the stream gets a migration
with the same ``reshardingId`` and they switch, drain and retire together.
Everything stream-wide runs under the ``StreamLock``; every change to a
group runs as a normal critical section (group mutex, pure core step,
revision CAS).

* ``scale``: record PREPARING migrations for every group, provision the new
  shard streams with the Redis group of every group on each (idempotent),
  then ``complete_provisioning`` everywhere (routing switches).  A
  provisioning failure ends every migration with ``fail_provisioning``, so
  nothing is ever routed to a shard that does not exist.
* ``rollback``: all groups or none (refused while any of them already
  retired a shard).
* ``advance`` (the tick loop, once per stream with an active migration):
  finish an interrupted PREPARING (provision again, complete), then, once
  every group's producer routing lease has run out since its switch, probe
  the removed shards (``drain.DrainProber``, outside any group critical
  section) and apply the results; retire a shard (re-check and delete, one
  script) only when it is proven and unheld in every group.  A new
  coordinator process resumes all of this from Redis.

Every stream-wide decision (what to provision, probe and retire, the
producer-lease gate, "every group agrees") is made by the pure planner in
``core/planner.py``; this module only carries the plans out.  The stream
lock, group loading and stream-record sync belong to ``CoordinatorService``.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from redis.exceptions import RedisError

from streamkit.protocol import MigrationState
from streamkit_server.coordination.drain import DrainProber, DrainResult
from streamkit_server.coordination.executor import Operation, group_not_found, now_ms
from streamkit_server.coordination.service import CoordinatorService
from streamkit_server.core import MAX_SHARD_COUNT as CORE_MAX_SHARD_COUNT
from streamkit_server.core import (
    CoordinatorConfig,
    GroupMetadata,
    MigrationRecord,
    ReshardingSpec,
    Result,
    apply_drain_probe,
    apply_retirement,
    complete_provisioning,
    fail_provisioning,
    rollback_resharding,
    start_resharding,
)
from streamkit_server.core.planner import (
    DrainPlan,
    active_migrations,
    added_shards,
    participants,
    plan_drain,
    plan_provisioning,
    refuse_active,
)
from streamkit_server.core.streams import Ordering, common_layout
from streamkit_server.errors import CoordinatorError, Rejected
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.streams import StreamLock, read_record, stream_group_names

__all__ = ["MAX_SHARD_COUNT", "ReshardingService", "ScaleOutcome"]

log = logging.getLogger("streamkit_server.resharding")

#: Upper bound of ``targetShardCount`` (the same bound as the default count).
MAX_SHARD_COUNT: Final = CORE_MAX_SHARD_COUNT

#: A pure core step of one group: ``Result`` whose response is the group after it.
_Step = Callable[[GroupMetadata, int], Result[GroupMetadata]]


def core_step(keys: GroupKeys, step: _Step) -> Operation[GroupMetadata]:
    """An ``Operation`` applying one pure core step; answers the group after it."""

    def op(group: GroupMetadata | None, now: int) -> Result[GroupMetadata]:
        if group is None:
            raise group_not_found(keys)
        return step(group, now)

    return op


@dataclass(frozen=True, slots=True)
class ScaleOutcome:
    """What a scale of the stream the caller named started."""

    target_shard_count: int
    resharding_id: str
    #: Every group of the stream, as written after the switch.
    groups: Mapping[str, GroupMetadata]


def find_migration(group: GroupMetadata, resharding_id: str) -> MigrationRecord:
    for migration in group.migrations:
        if migration.resharding_id == resharding_id:
            return migration
    raise CoordinatorError(
        "MIGRATION_NOT_FOUND",
        f"group {group.consumer_group!r} of stream {group.stream_prefix!r} has no migration "
        f"{resharding_id!r}",
    )


def _new_resharding_id() -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"rs-{stamp}-{secrets.token_hex(4)}"


class ReshardingService:
    def __init__(self, service: CoordinatorService, prober: DrainProber) -> None:
        self.service = service
        self.prober = prober
        self.config: CoordinatorConfig = service.config
        # (stream, shard) -> last unproven drain result we logged, so a shard
        # that stays unproven for minutes is logged once, not on every pass.
        self._unproven: dict[tuple[str, int], DrainResult] = {}
        self._aged: set[str] = set()

    # -- admin -----------------------------------------------------------------------

    async def scale(
        self,
        stream_prefix: str,
        target: int,
        *,
        requested_by: str,
        reason: str | None,
        ordering: Ordering | None = None,
        group: str | None = None,
    ) -> ScaleOutcome:
        """Scale every group of the stream; ``group`` must be one of them when given."""
        if not 0 <= target <= MAX_SHARD_COUNT:
            raise CoordinatorError(
                "INVALID_TARGET_SHARD_COUNT",
                f"targetShardCount must be 0..{MAX_SHARD_COUNT}, got {target}",
            )
        service = self.service
        async with service.gate.critical(), self.service.stream_lock(stream_prefix) as lock:
            record = await read_record(service.store, stream_prefix)
            groups = await self.service.load_groups(
                stream_prefix, await stream_group_names(service.store, stream_prefix, record)
            )
            if group is not None and group not in groups:
                raise group_not_found(service.keys(stream_prefix, group))
            if not groups:
                if record is None:
                    raise CoordinatorError(
                        "STREAM_NOT_FOUND", f"stream {stream_prefix!r} does not exist"
                    )
                raise CoordinatorError(
                    "NO_CONSUMER_GROUPS",
                    f"stream {stream_prefix!r} has no consumer groups, so nothing routes to "
                    "it; create a group first",
                )
            refuse_active(stream_prefix, groups.values())
            layout = common_layout(stream_prefix, groups.values())
            assert layout is not None
            ordered = (ordering or (record.ordering if record else "none")) == "key"
            rid = _new_resharding_id()
            names = sorted(groups)  # those that still exist
            known = set().union(*(g.known_shards() for g in groups.values()))
            spec = ReshardingSpec(
                resharding_id=rid, target_shard_count=target, requested_by=requested_by,
                reason=reason, ordered=ordered, avoid=frozenset(known),
            )  # fmt: skip
            start = functools.partial(_start, layout=layout, spec=spec, config=service.config)
            started: list[str] = []
            try:
                for name in names:
                    groups[name] = await self._step(stream_prefix, name, start)
                    started.append(name)
                added = added_shards(stream_prefix, rid, groups.values())
                collisions = await service.provisioner.collisions(stream_prefix, added)
                if collisions:
                    raise CoordinatorError(
                        "STREAM_KEYS_EXIST",
                        f"the new shard keys of stream {stream_prefix!r} already hold data "
                        f"nobody routed there: {', '.join(collisions[:5])}",
                    )
                try:
                    for name in names:
                        await service.provisioner.provision(stream_prefix, added, name)
                except (RedisError, OSError) as exc:
                    service.metrics.provisioning_failures.inc()
                    raise CoordinatorError(
                        "REDIS_STREAM_PROVISIONING_FAILED",
                        f"provisioning the new shard streams {added} of {stream_prefix!r} "
                        f"failed: {type(exc).__name__}: {exc}",
                    ) from exc
                lock.check()
            except Rejected as exc:
                raise await self._abandon(stream_prefix, rid, started, exc) from exc
            except Exception as exc:
                # Mutex timeouts, unusable metadata, Redis trouble: the groups
                # already PREPARING must not stay half-started (they would end
                # up on different layouts); the original error is answered.
                interrupted = CoordinatorError("COORDINATOR_BUSY", f"scale interrupted: {exc}")
                await self._abandon(stream_prefix, rid, started, interrupted)
                raise
            for name in names:
                groups[name] = await self._step(
                    stream_prefix, name, _bind(complete_provisioning, rid, self.config)
                )
            await service.sync_stream_record(stream_prefix, groups, record)
        log.info(
            "stream %s: migration %s to %d shards (%s) switched for groups %s",
            stream_prefix, rid, target, "ordered" if ordered else "unordered", names,
        )  # fmt: skip
        return ScaleOutcome(target, rid, groups)

    async def rollback(self, keys: GroupKeys, resharding_id: str) -> GroupMetadata:
        """Roll the migration back in every group of the stream, or in none."""
        prefix = keys.stream_prefix
        service = self.service
        async with service.gate.critical(), self.service.stream_lock(prefix):
            record = await read_record(service.store, prefix)
            groups = await self.service.load_groups(
                prefix, await stream_group_names(service.store, prefix, record)
            )
            mine = groups.get(keys.consumer_group)
            if mine is None:
                raise group_not_found(keys)
            find_migration(mine, resharding_id)
            parts = sorted(
                n for n, g in groups.items()
                if any(m.resharding_id == resharding_id for m in g.migrations)
            )  # fmt: skip
            now = now_ms()
            for name in parts:  # dry run: all or nothing (raises ReshardingRejected)
                rollback_resharding(groups[name], resharding_id, now, self.config)
            for name in parts:
                groups[name] = await self._step(
                    prefix, name, _bind(rollback_resharding, resharding_id, self.config)
                )
            await service.sync_stream_record(prefix, groups, record)
        log.info("stream %s: migration %s rolled back in groups %s", prefix, resharding_id, parts)
        return groups[keys.consumer_group]

    # -- the tick loop ------------------------------------------------------------------

    async def advance(self, stream_prefix: str, names: Sequence[str]) -> None:
        """Do the Redis work the stream's active migrations wait for (one pass)."""
        lock = self.service.stream_lock(stream_prefix)
        async with lock.attempt() as held:
            if not held:
                return  # a scale or rollback is running; next pass
            record = await read_record(self.service.store, stream_prefix)
            # The record also names groups the index may have lost.
            names = sorted({*names, *(record.groups if record is not None else ())})
            groups = await self.service.load_groups(stream_prefix, names)
            self._observe_age(stream_prefix, groups.values())
            for rid in active_migrations(groups.values()):
                await self._finish_provisioning(stream_prefix, rid, groups, lock)
                # Provisioning may have switched groups: plan the drain on what is stored now.
                parts = participants(
                    await self.service.load_groups(
                        stream_prefix, sorted(participants(groups, rid))
                    ),
                    rid,
                )
                plan = plan_drain(rid, parts, now_ms(), self.config)
                if plan is not None:
                    await self._drain(stream_prefix, plan, sorted(groups), lock)
            await self.service.sync_stream_record(
                stream_prefix, await self.service.load_groups(stream_prefix, names), record
            )

    async def _finish_provisioning(
        self, prefix: str, rid: str, groups: Mapping[str, GroupMetadata], lock: StreamLock
    ) -> None:
        plan = plan_provisioning(prefix, rid, participants(groups, rid), now_ms(), self.config)
        if plan is None:
            return
        log.warning(
            "stream %s: migration %s was left PREPARING (coordinator restart?); "
            "provisioning %s again and switching", prefix, rid, list(plan.shards),
        )  # fmt: skip
        for name in sorted(groups):
            await self.service.provisioner.provision(prefix, list(plan.shards), name)
        lock.check()
        for name in plan.complete:
            await self._step(prefix, name, _bind(complete_provisioning, rid, self.config))

    async def _drain(
        self, prefix: str, plan: DrainPlan, names: Sequence[str], lock: StreamLock
    ) -> None:
        """Carry out ``plan``: probe, record the proofs, retire, record the outcomes."""
        rid = plan.resharding_id
        facts = {s: await self.prober.probe(prefix, s, names) for s in plan.probe}
        for s, result in facts.items():
            self._note_unproven(prefix, s, result)
        drained = {s: r is DrainResult.DRAINED for s, r in facts.items()}
        for name, proven in plan.probe_results(drained).items():
            await self._step(prefix, name, _bind(apply_drain_probe, rid, self.config, proven))
        if not plan.retire:
            return
        lock.check()
        retired: dict[int, bool] = {}
        for s in plan.retire:
            result = await self.prober.retire(prefix, s, names)
            retired[s] = result is DrainResult.DRAINED
            if retired[s]:
                self.service.metrics.shards_retired.inc()
            else:
                # New entries arrived after the probe: read them first.
                self.service.metrics.retirements_refused.inc()
                self._note_unproven(prefix, s, result)
        log.info("stream %s: migration %s retired %s", prefix, rid, retired)
        for name, outcome in plan.retirement_results(retired).items():
            await self._step(prefix, name, _bind(apply_retirement, rid, self.config, outcome))

    # -- helpers ------------------------------------------------------------------------

    async def _step(self, stream_prefix: str, name: str, step: _Step) -> GroupMetadata:
        keys = self.service.keys(stream_prefix, name)
        return await self.service.executor.submit(keys, core_step(keys, step))

    async def _abandon(
        self, prefix: str, rid: str, started: Sequence[str], error: Rejected
    ) -> Rejected:
        """Fail the PREPARING migrations of a scale that cannot go on."""
        problem: str | None = None
        for name in started:
            try:
                after = await self._step(prefix, name, _bind(fail_provisioning, rid, self.config))
            except (Rejected, RedisError, OSError) as exc:
                problem = f"recording that failed for group {name!r} too ({exc})"
                continue
            if _state(after, rid) is not MigrationState.ROLLED_BACK:
                problem = f"another coordinator already switched group {name!r}"
        if not started:
            return error
        if problem is None:
            note = f"; migration {rid} was rolled back and routing is unchanged"
        else:
            note = (
                f"; {problem}: the coordinator's tick loop finishes migration {rid} "
                f"(GET .../migrations/{rid} shows its state)"
            )
        return CoordinatorError(error.error_code, error.message + note)

    def _note_unproven(self, prefix: str, shard: int, result: DrainResult) -> None:
        key = (prefix, shard)
        if result is DrainResult.DRAINED:
            self._unproven.pop(key, None)
            return
        if self._unproven.get(key) is result:
            return
        self._unproven[key] = result
        if result is DrainResult.GROUP_MISSING:
            log.error(
                "stream %s: removed shard %d still holds entries but a consumer group of the "
                "stream is missing on it; it is not retired (recreate the Redis group, or "
                "delete the key yourself once you know its entries are not needed)",
                prefix, shard,
            )  # fmt: skip
        else:
            log.info("stream %s: removed shard %d is not drained yet", prefix, shard)

    def _observe_age(self, prefix: str, groups: Iterable[GroupMetadata]) -> None:
        created = [m.created_at_ms for g in groups if (m := g.active_migration()) is not None]
        if created:
            gauge = self.service.metrics.resharding_age_seconds
            gauge.labels(prefix).set(max(0.0, (now_ms() - min(created)) / 1000))
            self._aged.add(prefix)

    def forget_ages(self, migrating: Iterable[str]) -> None:
        """Drop the age gauge of streams whose migration has ended."""
        for prefix in self._aged - set(migrating):
            self._aged.discard(prefix)
            self.service.metrics.resharding_age_seconds.remove(prefix)


# -- pure helpers -------------------------------------------------------------------------


def _start(
    group: GroupMetadata,
    now: int,
    *,
    layout: tuple[int, ...],
    spec: ReshardingSpec,
    config: CoordinatorConfig,
) -> Result[GroupMetadata]:
    if tuple(group.layout) != layout:
        raise CoordinatorError(
            "LAYOUT_CHANGED", "the stream's layout changed during the request; retry"
        )
    return start_resharding(group, spec, now, config)


def _bind(
    fn: Callable[..., Result[GroupMetadata]], rid: str, config: CoordinatorConfig, *extra: object
) -> _Step:
    """``fn(group, rid, *extra, now, config)`` as a step of ``(group, now)``."""

    def step(group: GroupMetadata, now: int) -> Result[GroupMetadata]:
        return fn(group, rid, *extra, now, config)

    return step


def _state(group: GroupMetadata, rid: str) -> MigrationState:
    return find_migration(group, rid).state
