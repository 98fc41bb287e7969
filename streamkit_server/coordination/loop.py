"""The tick loop: applies due timeouts (lease expiry, fencing, clean-up).

Runs in every coordinator process.  Each pass walks the group index, reads
each group (a parse-cached load, no mutex) and, when ``next_deadline_ms`` says
something is due, runs ``tick`` as a normal critical section (group mutex +
revision CAS), so two processes ticking the same group never double-apply:
the second one finds nothing due after the first one's write.

Then, for every stream with an active migration, it does the Redis work the
migration waits for (``ReshardingService.advance``: finish provisioning,
drain probes, retirement) under the stream lock, so one process at a time.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import InitVar, dataclass

import anyio
from redis.exceptions import RedisError, ResponseError

from streamkit_server.coordination.executor import now_ms
from streamkit_server.coordination.gate import CoordinatorTerminating
from streamkit_server.coordination.passes import guarded_pass
from streamkit_server.coordination.resharding import ReshardingService
from streamkit_server.coordination.service import CoordinatorService
from streamkit_server.coordination.timings import Timings
from streamkit_server.core import next_deadline_ms
from streamkit_server.errors import Rejected
from streamkit_server.observability.gauges import GroupGauges, group_gauges
from streamkit_server.store.mutex import MutexTimeout
from streamkit_server.store.records import StoreError

__all__ = ["TickLoop"]

log = logging.getLogger("streamkit_server.loop")

# The index is only an aid; re-derive it from the metadata keys now and then.
_INDEX_REBUILD_S = 60.0


@dataclass(eq=False, repr=False)
class TickLoop:
    service: CoordinatorService
    interval_ms: InitVar[int]
    resharding: ReshardingService | None = None
    timings: Timings | None = None

    def __post_init__(self, interval_ms: int) -> None:
        self.interval_s = interval_ms / 1000
        self.last_pass_started: float | None = None
        self.last_error: str | None = None
        self.running = False
        #: "<prefix>/<group>" of the groups the last pass could not use
        #: (unknown schema/layout version, corrupt): health reports them.
        self.unreadable: tuple[str, ...] = ()
        self._last_rebuild = 0.0
        self._exported: set[tuple[str, str]] = set()

    def lag_seconds(self) -> float | None:
        """Seconds since the last pass started beyond one interval (None before the first)."""
        if self.last_pass_started is None:
            return None
        return max(0.0, time.monotonic() - self.last_pass_started - self.interval_s)

    async def run(self) -> None:
        self.running = True
        gate = self.service.gate
        try:
            next_at = time.monotonic()
            while not gate.terminating:
                started = time.monotonic()
                self.service.metrics.tick_lag_seconds.set(max(0.0, started - next_at))
                self.last_pass_started = started
                try:
                    # A bug must not stop expiries and migrations for good:
                    # it is logged loudly (health shows it), tried next pass.
                    self.last_error = await guarded_pass(
                        log, "tick", self.pass_once, stop_on=(CoordinatorTerminating,)
                    )
                except CoordinatorTerminating:
                    break
                next_at = max(next_at + self.interval_s, time.monotonic())
                # Clamped: after a pass that overran, the difference is a hair
                # below zero and anyio.sleep() would raise, ending the loop.
                await anyio.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            self.running = False

    async def pass_once(self) -> None:
        service = self.service
        store = service.store
        if self.timings is not None:
            # Keeps this process' timings visible to coordinators starting later.
            with contextlib.suppress(RedisError, OSError):
                conflict = await self.timings.refresh()
                # Another live process judges leases with other timings: every
                # decision here (an expiry, a grant) could contradict one of
                # its leases, so none is made until the conflict is gone.
                if conflict is not None:
                    service.gate.suspend(str(conflict))
                elif service.gate.suspended is not None:
                    service.gate.resume()
                service.metrics.suspended.set(0 if service.gate.suspended is None else 1)
            if service.gate.suspended is not None:
                return
        if time.monotonic() - self._last_rebuild > _INDEX_REBUILD_S:
            self._last_rebuild = time.monotonic()
            await store.rebuild_index()
        streams: dict[str, list[str]] = {}
        migrating: set[str] = set()
        seen: set[tuple[str, str]] = set()
        unreadable: list[str] = []
        for prefix, group in await store.indexed_groups():
            if service.gate.terminating:
                return
            keys = service.keys(prefix, group)
            streams.setdefault(prefix, []).append(group)
            try:
                loaded = await store.load(keys)
                if loaded is None:
                    continue
                seen.add((prefix, group))
                self._export(prefix, group, group_gauges(loaded.group, now_ms()))
                service.metrics.detail.observe_group(loaded.group)
                if loaded.group.active_migration() is not None:
                    migrating.add(prefix)
                due = next_deadline_ms(loaded.group, service.config)
                if due is not None and due <= now_ms():
                    async with service.gate.critical():
                        await service.tick_group(keys)
            except MutexTimeout:
                continue  # someone else is in the group's critical section
            except StoreError as exc:
                unreadable.append(f"{prefix}/{group}")
                log.error("not ticking %s: %s", keys.metadata, exc)
        self.unreadable = tuple(unreadable)
        self._forget(seen)
        if self.resharding is not None:
            for prefix in sorted(migrating):
                await self._advance(self.resharding, prefix, streams[prefix])
            self.resharding.forget_ages(migrating)

    def _export(self, prefix: str, group: str, gauges: GroupGauges) -> None:
        metrics = self.service.metrics
        metrics.member_heartbeat_age.labels(prefix, group).set(gauges.heartbeat_age_seconds)
        metrics.revoke_pending.labels(prefix, group).set(gauges.revoke_pending)
        metrics.revoking_shards.labels(prefix, group).set(gauges.revoking_shards)
        metrics.consumer_shard_pending.labels(prefix, group).set(gauges.pending_shards)
        self._exported.add((prefix, group))

    def _forget(self, seen: set[tuple[str, str]]) -> None:
        # Deleted groups drop their series: cardinality follows the live groups.
        metrics = self.service.metrics
        for labels in self._exported - seen:
            for gauge in (metrics.member_heartbeat_age, metrics.revoke_pending,
                          metrics.revoking_shards, metrics.consumer_shard_pending):  # fmt: skip
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        self._exported &= seen
        metrics.detail.forget_except(seen)

    async def _advance(self, resharding: ReshardingService, prefix: str, groups: list[str]) -> None:
        try:
            async with self.service.gate.critical():
                await resharding.advance(prefix, groups)
        except (Rejected, MutexTimeout, StoreError, ResponseError) as exc:
            # One stream's trouble (a missing group, a shard key of the wrong
            # type, metadata to repair) must not stall the others.
            log.error("resharding of stream %s is stuck: %s", prefix, exc)
