"""The coordinator workflows: mutex -> load -> core -> CAS write -> respond.

Every mutation of a group runs through ``GroupExecutor.submit``:

1. a per-process, per-group ``asyncio.Lock`` (the "local monitor" of seed 000)
   so requests of one process queue locally instead of spinning on Redis;
2. the group mutex in Redis, taken together with the load (one Lua script);
   or, for a batch that only writes member records (a steady heartbeat), no
   mutex: the batch is applied to this process's parsed copy and one script
   writes it if Redis still holds that copy (revision and write id), or has
   only taken other members' records since (another process's heartbeats,
   sent back with the reply), else takes the mutex and loads in the same
   round trip (``_steady``);
3. the pure core (``handle_heartbeat`` / ``tick`` / ...) on the loaded value,
   which returns ``Result(state, changes, response)``;
4. a revision CAS write of ``changes`` (only the member records, for a steady
   heartbeat) that also releases the mutex;
5. only then the answers.

Heartbeats that queue up behind the local lock while a critical section runs
are applied together in the next one (one load, one write for the batch).
Each answer is computed from the state after that heartbeat, and the written
state is the result of applying the whole batch in order, so the history is
the same as handling them one by one and writing each; only the intermediate
writes are skipped.  Nothing is answered before the write succeeded.

A CAS conflict (another process wrote although we held the mutex, e.g. after
our mutex expired) reruns the whole batch on a fresh load.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeAlias, TypeVar

from streamkit.protocol import (
    CreateGroupRequest,
    CreateStreamRequest,
    DeleteGroupRequest,
    GroupResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatStatus,
    MemberState,
    StreamCreateResponse,
)
from streamkit_server import views
from streamkit_server.core import (
    LAYOUT_VERSION,
    SCHEMA_VERSION,
    Change,
    CoordinatorConfig,
    GroupCreated,
    GroupDeleted,
    GroupDocumentChanged,
    GroupMetadata,
    MemberUpserted,
    Result,
    Seen,
    WitnessSeen,
    begin_correction,
    handle_heartbeat,
    join_refusal,
    merge_changes,
    new_group,
    observe,
    steady,
    tick,
)
from streamkit_server.errors import CoordinatorError, Rejected
from streamkit_server.gate import TerminatingGate
from streamkit_server.metrics import Metrics
from streamkit_server.mutex import MutexTimeout, lock_and_load
from streamkit_server.provisioning import Provisioner
from streamkit_server.settings import ServerSettings
from streamkit_server.store import CommitResult, GroupKeys, Loaded, MetadataStore, MutexBusy
from streamkit_server.streams import (
    Ordering,
    StreamLock,
    StreamRecord,
    common_layout,
    read_record,
    stream_group_names,
)

__all__ = ["CoordinatorService", "GroupExecutor", "Operation", "now_ms"]

log = logging.getLogger("streamkit_server.service")

_MAX_ATTEMPTS: Final = 4


class _Attempt(enum.Enum):
    DONE = "done"
    RERUN = "rerun"  # the revision CAS lost: load again
    SERVER_CHANGED = "server-changed"  # load again and open a correction round


R = TypeVar("R")


def now_ms() -> int:
    # Wall clock, not monotonic: leases recorded by one process are checked by
    # another, so every coordinator must use the same (NTP-synced) time base.
    return time.time_ns() // 1_000_000


#: One group operation: the current state (``None``: no such group) and the
#: time in, a core ``Result`` out.  May raise ``Rejected``: the operation then
#: fails alone and leaves the group as it was.
Operation: TypeAlias = Callable[[GroupMetadata | None, int], Result[R]]


def group_not_found(keys: GroupKeys) -> CoordinatorError:
    return CoordinatorError(
        "GROUP_NOT_FOUND",
        f"consumer group {keys.consumer_group!r} of stream {keys.stream_prefix!r} has no "
        f"coordinator metadata; create it with: streamkit group create {keys.stream_prefix} "
        f"{keys.consumer_group} (heartbeats never create or rebuild groups)",
    )


def group_already_exists(keys: GroupKeys) -> CoordinatorError:
    return CoordinatorError(
        "GROUP_ALREADY_EXISTS",
        f"consumer group {keys.consumer_group!r} of stream {keys.stream_prefix!r} already exists",
    )


@dataclass
class _Item:
    op: Operation[Any]
    future: asyncio.Future[Any]


@dataclass
class _Lane:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: list[_Item] = field(default_factory=list)


class GroupExecutor:
    def __init__(self, store: MetadataStore, settings: ServerSettings, metrics: Metrics) -> None:
        self.store = store
        self.settings = settings
        self.config = settings.coordinator_config()
        self.metrics = metrics
        self._lanes: dict[str, _Lane] = {}
        # The highest revision this process loaded under the mutex or wrote,
        # per group: a lower one later means Redis lost writes.
        self._seen: dict[str, Seen] = {}

    async def submit(self, keys: GroupKeys, op: Operation[R]) -> R:
        """Run ``op`` in a critical section of its group; its response, or what it raised."""
        lane = self._lanes.get(keys.metadata)
        if lane is None:
            lane = self._lanes[keys.metadata] = _Lane()
        item = _Item(op, asyncio.get_running_loop().create_future())
        lane.pending.append(item)
        async with lane.lock:
            if not item.future.done():
                batch, lane.pending = lane.pending, []
                await _finish_even_if_cancelled(self._run(keys, batch))
        response: R = item.future.result()
        return response

    def forget(self, keys: GroupKeys) -> None:
        """The group is being recreated: a new lifecycle, nothing to compare with."""
        self.store.forget(keys)
        self._seen.pop(keys.metadata, None)

    async def _run(self, keys: GroupKeys, batch: list[_Item]) -> None:
        self.metrics.batch_size.observe(len(batch))
        try:
            first = await self._steady(keys, batch)
            if first is True:
                return
            locked = first if isinstance(first, _Locked) else None
            server_changed = False
            for _attempt in range(_MAX_ATTEMPTS):
                outcome = await self._attempt(keys, batch, server_changed, locked)
                if outcome is _Attempt.DONE:
                    return
                server_changed = outcome is _Attempt.SERVER_CHANGED
                locked = None
            for item in batch:
                _fail(item, MutexTimeout(f"{keys.metadata}: gave up after repeated CAS conflicts"))
        except BaseException as exc:
            for item in batch:
                _fail(item, exc)
            if not isinstance(exc, Exception):
                raise

    async def _steady(self, keys: GroupKeys, batch: list[_Item]) -> _Locked | bool:
        """The batch in one round trip, when this process's copy is current.

        The batch is applied to the parsed copy of the group; when that is a
        member-only write, one script writes it if Redis still holds that
        copy, or has only taken other members' records since (and no one
        holds the mutex).  True: answered.  Otherwise
        the script has taken the mutex and loaded, as ``lock_and_load``'s
        first try would: the ``_Locked`` to rerun the batch from; False: not
        tried, or the mutex was busy.
        """
        cached = self.store.cached(keys)
        seen = self._seen.get(keys.metadata)
        if cached is None or cached.layout_version != LAYOUT_VERSION:
            return self._locked_because("no_copy")
        # Only a copy no older than what this process loaded under the mutex
        # or wrote: a read-only load (the tick's, a view's) may bring a lower
        # revision than this process saw (Redis went back), and only the
        # locked path opens the correction round for that.  A read that moved
        # the copy forward is what a locked load would have found: the locked
        # path would observe no regression in it either.
        if (
            seen is None
            or cached.revision < seen.revision
            or seen.lifecycle != cached.group.created_at_ms
        ):
            return self._locked_because("copy_not_seen")
        now = now_ms()
        state, changes, outcomes = _apply(cached.group, batch, now)
        merged = merge_changes(changes)
        if state is None or not merged:
            return self._locked_because("no_member_write")
        if not steady(merged):
            return self._locked_because("document_change")
        token = self.store.new_token()
        try:
            reply = await self.store.commit_steady(
                cached, state, merged, token, self.settings.mutex_ttl_ms
            )
        except MutexBusy:
            return self._locked_because("mutex_busy")
        if not isinstance(reply, CommitResult):
            # Redis holds a newer copy (another process wrote): loaded.
            self.metrics.locked_writes.labels("copy_stale").inc()
            return _Locked(token, reply)
        self._observe(keys, state, reply.revision or 0)
        self._after_write(keys, cached.group, state, merged)
        _answer(batch, outcomes)
        return True

    def _locked_because(self, reason: str) -> bool:
        """Count why a batch takes the locked path (``/metrics``); False."""
        self.metrics.locked_writes.labels(reason).inc()
        return False

    def _observe(
        self, keys: GroupKeys, group: GroupMetadata, revision: int, server_changed: bool = False
    ) -> int | None:
        """Remember ``revision``; the version to correct from when Redis went back."""
        seen = self._seen.get(keys.metadata)
        observation = observe(
            seen,
            group.created_at_ms,
            revision,
            group.metadata_version,
            locked=True,
            server_changed=server_changed,
        )
        self._seen[keys.metadata] = observation.seen
        if observation.regressed_from_version is None:
            return None
        self.metrics.metadata_regression.inc()
        if server_changed:
            log.warning(
                "%s was last written by another Redis server (failover, restart or restore): "
                "writes may have been lost; opening a metadata correction round",
                keys.metadata,
            )
        elif seen is not None:
            log.warning(
                "metadata revision regression for %s: this process saw revision %d, "
                "Redis now holds %d (lost writes, failover or restore); "
                "opening a metadata correction round",
                keys.metadata,
                seen.revision,
                revision,
            )
        return observation.regressed_from_version

    async def _attempt(
        self,
        keys: GroupKeys,
        batch: list[_Item],
        server_changed: bool,
        locked: _Locked | None = None,
    ) -> _Attempt:
        """One load/apply/write round, rerun unless DONE.

        ``server_changed``: the last attempt's write was refused because
        another Redis server incarnation stamped the group; this one opens a
        correction round first (see ``store._COMMIT``).  ``locked``: the mutex
        is held already and the group loaded with it.
        """
        if locked is None:
            token = self.store.new_token()
            loaded = await lock_and_load(
                self.store, keys, token, self.settings.mutex_ttl_ms, self.settings.mutex_wait_ms
            )
        else:
            token, loaded = locked.token, locked.loaded
        committed = False
        try:
            now = now_ms()
            before = loaded.group if loaded is not None else None
            state = before
            opened: list[tuple[Change, ...]] = []
            if loaded is not None:
                regressed = self._observe(keys, loaded.group, loaded.revision, server_changed)
                if regressed is not None:
                    # This process wrote a later revision than Redis now holds:
                    # open the correction round itself instead of waiting for a
                    # client to report a higher version (no shard moves for one
                    # member lease).
                    correction = begin_correction(loaded.group, now, self.config, regressed)
                    state = correction.state
                    opened.append(correction.changes)
            state, changes, outcomes = _apply(state, batch, now)
            merged = merge_changes([*opened, *changes])
            if not merged and loaded is not None and loaded.layout_version != LAYOUT_VERSION:
                merged = (GroupDocumentChanged(),)  # upgrade in place, under the mutex
            if not merged:
                committed = True  # nothing to write; the mutex is released below
                await self._release(loaded, keys, token)
            elif state is None:
                assert loaded is not None
                committed = await self.store.delete(loaded, token)
                if not committed:
                    self.metrics.state_conflicts.inc()
                    return _Attempt.RERUN
                self._seen.pop(keys.metadata, None)
            else:
                written = await self.store.commit(
                    loaded, keys, state, merged, token, restamp=server_changed
                )
                committed = True  # the script released the mutex either way
                if written.server_changed:
                    return _Attempt.SERVER_CHANGED
                if not written.ok:
                    log.warning("storeRevision conflict on %s; rerunning", keys.metadata)
                    return _Attempt.RERUN
                self._observe(keys, state, written.revision or 0)
                self._after_write(keys, before, state, merged)
            _answer(batch, outcomes)
            return _Attempt.DONE
        finally:
            if not committed and loaded is not None:
                # Best effort; the TTL frees the mutex if even this fails.
                await _quietly(self.store.release(keys.mutex, token))

    async def _release(self, loaded: Loaded | None, keys: GroupKeys, token: str) -> None:
        if loaded is not None:  # a missing group's mutex was given back by the load script
            await self.store.release(keys.mutex, token)

    def _after_write(
        self,
        keys: GroupKeys,
        before: GroupMetadata | None,
        after: GroupMetadata,
        changes: Sequence[Change],
    ) -> None:
        old = before.members if before is not None else {}
        for change in changes:
            if not isinstance(change, MemberUpserted):
                continue
            member = change.member
            previous = old.get(member.member_id)
            if previous is None or previous.state is member.state:
                continue
            if member.state is MemberState.EXPIRED:
                self.metrics.member_expired.inc()
            elif member.state is MemberState.FENCED:
                self.metrics.member_fenced.inc()
        if steady(changes):
            return  # member records only: ownership did not change
        problems = views.invariant_violations(after)
        if problems:
            self.metrics.invariant_violations.inc(len(problems))
            log.error("invariant violations in %s: %s", keys.metadata, "; ".join(problems))


@dataclass(frozen=True, slots=True)
class _Locked:
    """The group mutex taken with ``token`` and the group loaded with it."""

    token: str
    loaded: Loaded | None


def _apply(
    state: GroupMetadata | None, batch: list[_Item], now: int
) -> tuple[GroupMetadata | None, list[tuple[Change, ...]], dict[int, Any]]:
    """Run the batch's operations in order: the state after them, their changes, and
    each one's response or ``Rejected`` (by position)."""
    changes: list[tuple[Change, ...]] = []
    outcomes: dict[int, Any] = {}
    for position, item in enumerate(batch):
        try:
            result = item.op(state, now)
        except Rejected as exc:
            outcomes[position] = exc
            continue
        state = result.state
        changes.append(result.changes)
        outcomes[position] = result.response
    return state, changes, outcomes


def _answer(batch: list[_Item], outcomes: dict[int, Any]) -> None:
    for position, item in enumerate(batch):
        outcome = outcomes.get(position)
        if isinstance(outcome, BaseException):
            _fail(item, outcome)
        elif not item.future.done():
            item.future.set_result(outcome)


def _fail(item: _Item, exc: BaseException) -> None:
    if not item.future.done():
        item.future.set_exception(exc)


async def _quietly(aw: Awaitable[object]) -> None:
    try:
        await aw
    except Exception:
        log.debug("best-effort mutex release failed", exc_info=True)


async def _finish_even_if_cancelled(aw: Awaitable[None]) -> None:
    """Await ``aw`` to completion even if the caller is cancelled meanwhile.

    A critical section that has taken the group mutex must finish its write
    and release (seed 000: in-flight critical sections complete); a cancelled
    caller only stops waiting for its own answer after that.
    """
    task = asyncio.ensure_future(aw)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                break
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    task.result()


# -- operations ----------------------------------------------------------------------
# Each builds an ``Operation`` from its (immutable) inputs; the executor runs it
# and hands back its response.  Nothing is read back from them after submit.


def heartbeat_op(
    keys: GroupKeys,
    member_id: str,
    request: HeartbeatRequest,
    config: CoordinatorConfig,
    metrics: Metrics,
    seen: list[WitnessSeen],
) -> Operation[HeartbeatResponse]:
    """``seen`` receives what the report claimed, when it claimed state Redis lacks."""

    def op(group: GroupMetadata | None, now: int) -> Result[HeartbeatResponse]:
        seen.clear()  # a CAS conflict runs the op again: keep the last run's verdict
        if group is None:
            metrics.metadata_missing.inc()
            raise group_not_found(keys)
        refusal = join_refusal(group, member_id, request, config)
        if refusal is not None:
            raise Rejected("TOO_MANY_MEMBERS", refusal)
        if request.metadata_version > group.metadata_version:
            metrics.metadata_version_ahead.inc()
        result = handle_heartbeat(group, member_id, request, now, config)
        if result.witness is not None:
            seen.append(result.witness)
        return result

    return op


def tick_op(config: CoordinatorConfig) -> Operation[bool]:
    """Answers whether anything was due."""

    def op(group: GroupMetadata | None, now: int) -> Result[bool]:
        if group is None:
            return Result(None, (), False)
        return tick(group, now, config)

    return op


def create_group_op(keys: GroupKeys, layout: Sequence[int]) -> Operation[GroupMetadata]:
    def op(group: GroupMetadata | None, now: int) -> Result[GroupMetadata]:
        if group is not None:
            raise group_already_exists(keys)
        fresh = new_group(keys.stream_prefix, keys.consumer_group, len(layout), now)
        # The stream's current layout, which after an ordered reshard is not
        # the identity new_group assumes.
        created = fresh.model_copy(update={"layout": list(layout)})
        return Result(created, (GroupCreated(),), created)

    return op


def delete_group_op(keys: GroupKeys, force: bool) -> Operation[GroupMetadata]:
    """Answers the group as it was before the deletion."""

    def op(group: GroupMetadata | None, now: int) -> Result[GroupMetadata]:
        if group is None:
            raise group_not_found(keys)
        if group.active_migration() is not None:
            # Its Redis consumer groups take part in the drain proof of the
            # migration's removed shards; deleting mid-way would strand it.
            raise CoordinatorError(
                "ACTIVE_MIGRATION_EXISTS",
                "the group has an active resharding migration; wait for it to finish "
                "or roll it back, then delete",
            )
        live = group.live_member_ids()
        if (live or group.owners) and not force:
            raise CoordinatorError(
                "GROUP_NOT_INACTIVE",
                f"group has {len(live)} live members and {len(group.owners)} held shards; "
                "let the members leave first, or pass force=true for recovery",
            )
        return Result(None, (GroupDeleted(),), group)

    return op


# -- the service -------------------------------------------------------------------


def _log_audit(record: dict[str, Any]) -> None:
    logging.getLogger("streamkit_server.audit").info(
        json.dumps(record, separators=(",", ":"), sort_keys=True)
    )


class CoordinatorService:
    def __init__(
        self,
        store: MetadataStore,
        provisioner: Provisioner,
        settings: ServerSettings,
        metrics: Metrics,
        gate: TerminatingGate,
    ) -> None:
        self.store = store
        self.provisioner = provisioner
        self.settings = settings
        self.config = settings.coordinator_config()
        self.metrics = metrics
        self.gate = gate
        self.executor = GroupExecutor(store, settings, metrics)
        #: Where records for the audit trail go; the runtime points it at the
        #: audit log and, when configured, the audit stream.
        self.audit: Callable[[dict[str, Any]], None] = _log_audit

    def keys(self, stream_prefix: str, consumer_group: str) -> GroupKeys:
        return self.store.group_keys(stream_prefix, consumer_group)

    # -- member API --------------------------------------------------------------

    async def heartbeat(
        self, keys: GroupKeys, member_id: str, request: HeartbeatRequest
    ) -> HeartbeatResponse:
        started = time.perf_counter()
        seen: list[WitnessSeen] = []
        op = heartbeat_op(keys, member_id, request, self.config, self.metrics, seen)
        try:
            async with self.gate.critical():
                response = await self.executor.submit(keys, op)
            if seen:
                self._witnessed(keys, seen[0])
        except MutexTimeout:
            # Not an HTTP error: the member simply heartbeats again.
            response = HeartbeatResponse(
                response_to=request.request_id,
                status=HeartbeatStatus.RETRY,
                member_id=request.member_id,
                member_epoch=request.member_epoch,
                heartbeat_interval_ms=self.config.heartbeat_interval_ms,
                rebalance_timeout_ms=self.config.rebalance_timeout_ms,
            )
        self.metrics.heartbeats_by_status(str(response.status)).inc()
        if response.status is HeartbeatStatus.UNSUPPORTED_PROTOCOL:
            self.metrics.compatibility_failures.labels("coordination_version").inc()
        self.metrics.heartbeat_seconds.observe(time.perf_counter() - started)
        return response

    def _witnessed(self, keys: GroupKeys, seen: WitnessSeen) -> None:
        self.metrics.rollback_witnesses.labels(seen.verdict).inc()
        if not seen.ignored:
            return
        # An ignored claim changed nothing, but a member credential sent it:
        # leave a record an operator can find (issue: forged witnesses).
        record = {
            "kind": "ignored-witness",
            "action": "heartbeat",
            "streamPrefix": keys.stream_prefix,
            "consumerGroup": keys.consumer_group,
            "memberId": seen.member_id[:256],
            "verdict": seen.verdict,
            "claimedVersion": seen.claimed_version,
            "storedVersion": seen.stored_version,
            "claimedEpoch": seen.claimed_epoch,
            "storedEpoch": seen.stored_epoch,
        }
        self.audit(record)

    # -- tick ----------------------------------------------------------------------

    async def tick_group(self, keys: GroupKeys) -> bool:
        changed = await self.executor.submit(keys, tick_op(self.config))
        if changed:
            self.metrics.ticks.inc()
        return changed

    # -- admin -----------------------------------------------------------------------

    async def create_stream(
        self, stream_prefix: str, request: CreateStreamRequest, ordering: Ordering | None = None
    ) -> StreamCreateResponse:
        count = request.initial_shard_count or self.settings.default_shard_count
        async with self.gate.critical(), self.stream_lock(stream_prefix):
            if await self.store.read_stream_record(stream_prefix) is not None:
                raise CoordinatorError(
                    "STREAM_ALREADY_EXISTS", f"stream {stream_prefix!r} already exists"
                )
            layout = list(range(count))
            await self._refuse_collisions(stream_prefix, layout)
            await self.provisioner.provision(stream_prefix, layout, None)
            await self._write_stream_record(
                stream_prefix,
                StreamRecord(tuple(layout), ordering or "none"),
                request.requested_by,
                request.reason,
            )
        return StreamCreateResponse(
            stream_prefix=stream_prefix, shard_count=count, metadata_version=1
        )

    async def create_group(
        self, keys: GroupKeys, request: CreateGroupRequest, ordering: Ordering | None = None
    ) -> GroupResponse:
        prefix = keys.stream_prefix
        async with self.gate.critical(), self.stream_lock(prefix):
            record = await read_record(self.store, prefix)
            others = await self._stream_groups(prefix, record, exclude=keys.consumer_group)
            for other in others:
                active = other.active_migration()
                if active is not None:
                    # The new group would miss the migration the others are in.
                    raise CoordinatorError(
                        "ACTIVE_MIGRATION_EXISTS",
                        f"stream {prefix!r} is being resharded ({active.resharding_id}, "
                        f"{active.state.value}); create the group once it has finished",
                    )
            # The groups are the source of truth for the layout; the record
            # only matters for a stream that has none (yet).
            current = common_layout(prefix, others)
            if current is None and record is not None:
                current = record.layout
            if current is not None:
                wanted = request.initial_shard_count
                if wanted is not None and wanted != len(current):
                    raise CoordinatorError(
                        "SHARD_COUNT_MISMATCH",
                        f"stream {prefix!r} has {len(current)} shards; initialShardCount="
                        f"{wanted} does not match (omit it, or scale the stream)",
                    )
                layout = list(current)
            else:
                count = request.initial_shard_count or self.settings.default_shard_count
                layout = list(range(count))
                await self._refuse_collisions(prefix, layout)
            if record is not None and ordering is not None and ordering != record.ordering:
                raise CoordinatorError(
                    "ORDERING_MISMATCH",
                    f"stream {prefix!r} has ordering={record.ordering!r}; the group cannot "
                    f"ask for {ordering!r} (omit it; an ordering given to a scale request "
                    "applies to that scale only)",
                )
            if await self.store.load(keys) is not None:
                # Checked before provisioning too, so a duplicate create does
                # not touch Redis; the create CAS below is what decides.
                raise group_already_exists(keys)
            await self.provisioner.provision(prefix, layout, keys.consumer_group)
            # The record names the group before its metadata exists, so a
            # stream-wide change can never miss it (see streams.py).
            fresh = StreamRecord(
                tuple(layout),
                record.ordering if record else ordering or "none",
                (*(record.groups if record else ()), keys.consumer_group),
            )
            if record is None:
                await self._write_stream_record(prefix, fresh, request.requested_by, request.reason)
            else:
                changed = fresh.layout_fields() if record.layout != fresh.layout else {}
                await self.store.update_stream_record(prefix, {**changed, **fresh.groups_field()})
            self.executor.forget(keys)
            created = await self.executor.submit(keys, create_group_op(keys, layout))
            await self.store.add_to_index(keys)
        return views.group_response(created)

    async def delete_group(self, keys: GroupKeys, request: DeleteGroupRequest) -> GroupResponse:
        prefix = keys.stream_prefix
        async with self.gate.critical(), self.stream_lock(prefix):
            snapshot = await self.executor.submit(keys, delete_group_op(keys, request.force))
            record = await read_record(self.store, prefix)
            if record is not None and keys.consumer_group in record.groups:
                rest = tuple(g for g in record.groups if g != keys.consumer_group)
                await self.store.update_stream_record(
                    prefix, replace(record, groups=rest).groups_field()
                )
            # Under the stream lock, so a concurrent re-create of the group
            # cannot have its fresh Redis groups destroyed.
            await self.provisioner.destroy_group(
                prefix, sorted(snapshot.known_shards()), keys.consumer_group
            )
        return views.group_response(snapshot)

    async def _refuse_collisions(self, stream_prefix: str, shards: Sequence[int]) -> None:
        collisions = await self.provisioner.collisions(stream_prefix, shards)
        if collisions:
            shown = ", ".join(collisions[:5]) + (" ..." if len(collisions) > 5 else "")
            raise CoordinatorError(
                "STREAM_KEYS_EXIST",
                f"stream {stream_prefix!r} has no coordinator metadata but its shard keys "
                f"already hold data: {shown}",
            )

    async def _write_stream_record(
        self, stream_prefix: str, record: StreamRecord, requested_by: str, reason: str | None
    ) -> None:
        stamp = str(now_ms())
        created = await self.store.create_stream_record(
            stream_prefix,
            {
                **record.layout_fields(),
                **record.groups_field(),
                "metadataVersion": "1",
                "schemaVersion": str(SCHEMA_VERSION),
                "layoutVersion": str(LAYOUT_VERSION),
                "createdAt": stamp,
                "updatedAt": stamp,
                "requestedBy": requested_by,
                "reason": reason or "",
            },
        )
        if not created:  # only possible if another writer ignored the stream lock
            raise CoordinatorError(
                "STREAM_ALREADY_EXISTS", f"stream {stream_prefix!r} already exists"
            )

    async def _stream_groups(
        self, stream_prefix: str, record: StreamRecord | None, exclude: str
    ) -> list[GroupMetadata]:
        names = await stream_group_names(self.store, stream_prefix, record)
        loaded = await self.load_groups(stream_prefix, (n for n in names if n != exclude))
        return list(loaded.values())

    # -- the stream-wide helpers, shared with the resharding service ------------------

    def stream_lock(self, stream_prefix: str) -> StreamLock:
        """The mutex of stream-wide changes (creation, scale, rollback, retirement)."""
        return StreamLock(
            self.store, stream_prefix, self.settings.mutex_ttl_ms, self.settings.mutex_wait_ms
        )

    async def load_groups(
        self, stream_prefix: str, names: Iterable[str]
    ) -> dict[str, GroupMetadata]:
        """The named groups of a stream as stored; a deleted group simply drops out."""
        out: dict[str, GroupMetadata] = {}
        for name in names:
            loaded = await self.store.load(self.keys(stream_prefix, name))
            if loaded is not None:
                out[name] = loaded.group
        return out

    async def sync_stream_record(
        self,
        stream_prefix: str,
        groups: Mapping[str, GroupMetadata],
        record: StreamRecord | None = None,
    ) -> None:
        """Make the stream record follow the groups' (common) layout.

        The groups are the source of truth; the record is what a group created
        later starts from, so every stream-wide change ends with this.
        """
        layout = common_layout(stream_prefix, groups.values())
        if layout is None:
            return
        if record is None:
            record = await read_record(self.store, stream_prefix)
        if record is not None and record.layout == layout:
            return
        fresh = StreamRecord(layout, record.ordering if record is not None else "none")
        await self.store.update_stream_record(
            stream_prefix, {**fresh.layout_fields(), "updatedAt": str(now_ms())}, bump=True
        )

    # -- reads -----------------------------------------------------------------------

    async def read_group(self, keys: GroupKeys) -> GroupMetadata:
        loaded = await self.store.load(keys)
        if loaded is None:
            raise group_not_found(keys)
        return loaded.group

    async def list_groups(self) -> list[GroupMetadata]:
        groups = []
        for prefix, group in await self.store.indexed_groups():
            loaded = await self.store.load(self.keys(prefix, group))
            if loaded is not None:  # a vanished key is skipped, never rebuilt
                groups.append(loaded.group)
        return groups
