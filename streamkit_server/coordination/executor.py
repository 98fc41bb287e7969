"""The coordinator workflows: mutex -> load -> core -> CAS write -> respond.

Every mutation of a group runs through ``GroupExecutor.submit``:

1. a per-process, per-group lane (the "local monitor" of seed 000): one
   critical section of a group at a time in a process, so requests of one
   process queue locally instead of spinning on Redis;
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

Heartbeats that queue up while a critical section runs are applied together
in the next one (one load, one write for the batch), which the first of their
callers still waiting runs (``GroupExecutor.submit``).
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
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, TypeVar

from streamkit.protocol import (
    MemberState,
)
from streamkit_server.coordination import views
from streamkit_server.core import (
    LAYOUT_VERSION,
    Change,
    GroupDocumentChanged,
    GroupMetadata,
    MemberUpserted,
    Result,
    Seen,
    begin_correction,
    merge_changes,
    observe,
    steady,
)
from streamkit_server.core import groups as core_groups
from streamkit_server.errors import Rejected
from streamkit_server.observability.metrics import Metrics
from streamkit_server.settings import ServerSettings
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.metadata import MetadataStore
from streamkit_server.store.mutex import MutexTimeout, lock_and_load
from streamkit_server.store.records import CommitResult, Loaded, MutexBusy

__all__ = ["GroupExecutor", "Operation", "group_already_exists", "group_not_found", "now_ms"]

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


def group_not_found(keys: GroupKeys) -> Rejected:
    return core_groups.group_not_found(keys.stream_prefix, keys.consumer_group)


def group_already_exists(keys: GroupKeys) -> Rejected:
    return core_groups.group_already_exists(keys.stream_prefix, keys.consumer_group)


@dataclass(slots=True)
class _Item:
    op: Operation[Any]
    #: The answer; or ``_LEAD``: its caller runs the next batch.
    future: asyncio.Future[Any]


#: An item's future resolved to this: its caller runs the lane's next batch.
_LEAD: Final = object()


@dataclass(slots=True)
class _Lane:
    pending: list[_Item] = field(default_factory=list)
    #: A caller is running a batch, or has been handed the next one.
    running: bool = False


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
        """Run ``op`` in a critical section of its group; its response, or what it raised.

        One batch of a group runs at a time.  A caller that finds one running
        waits on its own future: a later batch answers it, or the caller that
        ran the batch before hands it the next one (``_LEAD``).  Not a lock
        that every caller takes in turn only to find its answer there: a
        heartbeat wakes once, when it is answered.
        """
        lane = self._lanes.get(keys.metadata)
        if lane is None:
            lane = self._lanes[keys.metadata] = _Lane()
        loop = asyncio.get_running_loop()
        item = _Item(op, loop.create_future())
        lane.pending.append(item)
        if lane.running:
            try:
                outcome = await item.future
            except asyncio.CancelledError:
                # Cancelled after being handed the next batch: hand it on (the
                # item stays queued and runs with it, answered to no one, as a
                # caller cancelled while waiting always was).
                if _handed(item.future):
                    _hand_off(lane)
                raise
            if outcome is not _LEAD:
                response: R = outcome
                return response
            item.future = loop.create_future()
        lane.running = True
        try:
            batch, lane.pending = lane.pending, []
            await _finish_even_if_cancelled(self._run(keys, batch))
        finally:
            _hand_off(lane)
        answer: R = item.future.result()
        return answer

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
        correction round first (see ``store.scripts.COMMIT``).  ``locked``: the mutex
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


def _handed(future: asyncio.Future[Any]) -> bool:
    """Whether ``future`` was resolved to ``_LEAD`` (not cancelled, not failed)."""
    return (
        future.done()
        and not future.cancelled()
        and future.exception() is None
        and future.result() is _LEAD
    )


def _hand_off(lane: _Lane) -> None:
    """The lane's next batch to the first caller still waiting, if any."""
    for item in lane.pending:
        if not item.future.done():  # not cancelled, not already handed the batch
            item.future.set_result(_LEAD)
            return
    lane.running = False


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
