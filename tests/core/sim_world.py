"""The world the protocol simulation runs in: Redis, coordinator processes, members.

Redis is a list of committed snapshots (``Redis``), written the way the store
writes (only what a result's ``changes`` name); each coordinator process keeps
only what the server keeps per group (its highest-seen revision and its parsed
copy); members are the real ``MemberStateMachine``.  ``sim_machine`` drives
them; ``test_simulation`` and ``test_pinned_schedules`` run it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from streamkit.consumer.member import MemberStateMachine, new_incarnation
from streamkit.protocol import (
    HeartbeatRequest,
    HeartbeatResponse,
    MemberState,
    RevokingShardState,
)
from streamkit_server.core import (
    CoordinatorConfig,
    GroupMetadata,
    Result,
    TooManyMembers,
    apply_drain_probe,
    apply_retirement,
    begin_correction,
    complete_provisioning,
    handle_heartbeat,
    next_deadline_ms,
    pending_work,
    tick,
)
from streamkit_server.core.errors import Rejected
from streamkit_server.core.result import (
    Change,
    MemberRemoved,
    MemberUpserted,
    diff,
    merge_changes,
    steady,
)
from streamkit_server.core.rollback import Seen
from streamkit_server.core.rollback import observe as core_observe
from streamkit_server.store.metadata import WRITE_LOG_SIZE

from .coverage import SimulationCoverage

CONFIG = CoordinatorConfig(
    heartbeat_interval_ms=100,
    member_lease_ttl_ms=500,
    rebalance_timeout_ms=600,
    producer_routing_lease_ms=300,
    max_members_per_group=6,
)
# More members than shards: every shard is wanted by someone, so most checks
# happen while several members hold shards and handoffs are under way.
MEMBERS = ("m0", "m1", "m2", "m3", "m4")
SHARDS = 4
# The member limit is one above the members, so a short-lived process or two
# starting beside them meets it, and the departed records' cap (four per
# allowed member, ``core.limits``) is within reach of a schedule: joins then
# drop departed records (``evictable_records``).
MEMBER_LIMIT = CONFIG.max_members_per_group
PROCESSES = ("c0", "c1")
#: Requests whose late copies the network keeps: enough for several rounds of
#: every member.
COPIES_KEPT = 60
# Enough rounds for the slowest recovery path: a rebalance timeout, then the
# lease a fenced member's shards are held for, then a correction round's lease.
CONVERGENCE_ROUNDS = (CONFIG.rebalance_timeout_ms + 3 * CONFIG.member_lease_ttl_ms) // (
    CONFIG.heartbeat_interval_ms
) + 10

#: Filled by every run of the machine in this module; reported by the tests below.
COVERAGE = SimulationCoverage()


# -- Redis and the coordinator processes ------------------------------------------


def state_of(result: Result[Any]) -> GroupMetadata:
    """The group after a core operation (none of these deletes it)."""
    assert result.state is not None
    return result.state


class Snapshot(NamedTuple):
    revision: int
    group: GroupMetadata
    #: The Redis server incarnation that took the last document write (the
    #: store's ``redisServer`` field).
    stamp: int = 0
    #: What the write that made this snapshot logged (the store's write log):
    #: a document write, or the member records it wrote.
    document: bool = True
    written: frozenset[str] = frozenset()


@dataclass
class Redis:
    """The group's metadata hash as Redis holds it: committed snapshots, newest last.

    ``revision`` is Redis' own counter (the hash's ``revision`` field), so after
    a rollback new writes reuse revision numbers that were already seen, as
    they do on a real failover.  ``server`` is the incarnation answering now:
    a failover or restart changes it, a restore on the same process does not.
    """

    history: list[Snapshot]
    server: int = 0

    @property
    def current(self) -> tuple[int, GroupMetadata]:
        return self.history[-1].revision, self.history[-1].group

    @property
    def stamped_elsewhere(self) -> bool:
        return self.history[-1].stamp != self.server

    def commit(
        self,
        expected: int,
        group: GroupMetadata,
        *,
        document: bool,
        written: frozenset[str] = frozenset(),
    ) -> int:
        revision, _, stamp, *_ = self.history[-1]
        # The processes run one critical section at a time here, so the CAS
        # always holds; it is asserted to keep the model honest.
        assert revision == expected, (revision, expected)
        stamp = self.server if document else stamp
        self.history.append(Snapshot(revision + 1, group, stamp, document, written))
        return revision + 1

    def passed_only_by_others(self, copy: Snapshot, mine: frozenset[str]) -> bool:
        """The steady-write script's check (``store.scripts.STEADY_PRELUDE``): ``copy`` is
        on the current history line (its revision and writeId: the same snapshot),
        within the write log's reach, and every write since wrote only member
        records, none of ``mine``."""
        index = next((i for i, snap in enumerate(self.history) if snap is copy), None)
        if index is None or len(self.history) - 1 - index >= WRITE_LOG_SIZE:
            return False
        return all(not s.document and not s.written & mine for s in self.history[index + 1 :])


#: (group lifecycle, highest revision seen, metadataVersion at that revision)
Highest = Seen


def observe(
    highest: Seen | None,
    revision: int,
    group: GroupMetadata,
    *,
    locked: bool,
    server_changed: bool = False,
) -> tuple[Seen | None, int | None]:
    """Rollback detection: the server's own pure rule (``core.rollback.observe``).

    The service calls it on every locked load and after every write, keeping
    the returned ``Seen`` per group; read-only loads (the tick loop's scan)
    do not touch that memory.
    """
    if not locked:
        return highest, None
    seen = core_observe(
        highest,
        group.created_at_ms,
        revision,
        group.metadata_version,
        locked=True,
        server_changed=server_changed,
    )
    return seen.seen, seen.regressed_from_version


def stored_after(
    stored: GroupMetadata, state: GroupMetadata, changes: Sequence[Change]
) -> GroupMetadata:
    """What Redis holds once the store wrote ``changes`` over ``stored``.

    As the v2 layout: a document change rewrites the group document (every
    field but the member records) from ``state``; member records are written
    one by one, only those named by a change.  Whatever the core changed
    without saying so is therefore lost here, as it would be in Redis.
    """
    document = not steady(changes)
    base = state if document else stored
    members = dict(stored.members)
    for change in changes:
        if isinstance(change, MemberUpserted):
            members[change.member.member_id] = change.member
        elif isinstance(change, MemberRemoved):
            members.pop(change.member_id, None)
    return base.model_copy(update={"members": members})


#: One critical section's operation: the group in, the core's results out.
Op = Callable[[GroupMetadata], "Result[Any] | list[Result[Any]]"]


def upserted_members(changes: Sequence[Change]) -> frozenset[str]:
    """The member records a write names in the write log."""
    return frozenset(c.member.member_id for c in changes if isinstance(c, MemberUpserted))


def answered(response: HeartbeatResponse | None) -> HeartbeatResponse:
    """A heartbeat the pinned schedules expect answered (not refused)."""
    assert response is not None
    return response


def unchanged(group: GroupMetadata) -> Result[None]:
    return Result(group, (), None)


@dataclass
class CoordinatorProcess:
    """One coordinator process: stateless but for the highest revision it saw."""

    name: str
    redis: Redis
    highest: Highest | None = None
    #: The process's parsed copy of the group (the store's cache): set by every
    #: load, read-only or locked, and by every write.
    copy: Snapshot | None = None

    def peek(self) -> GroupMetadata:
        """A read-only load (the tick loop's scan): never consumes a regression."""
        revision, group = self.redis.current
        self.copy = self.redis.history[-1]
        self.highest, _ = observe(self.highest, revision, group, locked=False)
        return group

    def steady(self, op: Op, now: int) -> bool:
        """``GroupExecutor._steady``: the op on this process's copy, written in one
        round trip if it only wrote member records and Redis passed the copy only
        by other members' record writes.  False: the locked path decides instead.

        The answers the op gave on the copy are the ones the member gets; the
        simulation's checks then hold them to what Redis holds.
        """
        copy, seen = self.copy, self.highest
        if copy is None or seen is None:
            return False
        if copy.revision < seen.revision or seen.lifecycle != copy.group.created_at_ms:
            return False  # a read took the copy back: only the locked path opens rounds
        out = op(copy.group)
        results = out if isinstance(out, list) else [out]
        changes = merge_changes(result.changes for result in results)
        if not changes or not steady(changes):
            return False
        mine = upserted_members(changes)
        if not self.redis.passed_only_by_others(copy, mine):
            return False
        revision, current = self.redis.current
        if revision != copy.revision:
            COVERAGE.count("steady_catch_ups")
        stored = stored_after(current, state_of(results[-1]), changes)
        written = self.redis.commit(revision, stored, document=False, written=mine)
        self.copy = self.redis.history[-1]
        self.highest, _ = observe(self.highest, written, stored, locked=True)
        COVERAGE.count("member_only_writes")
        return True

    def run(self, op: Op, now: int) -> GroupMetadata:
        """One critical section of the service: locked load, op, write of its changes.

        As ``GroupService._attempt``: a regression noticed by the load opens a
        correction round before the op runs, and is written with its result.
        As the store's commit script: a document write on a Redis server
        incarnation other than the one that stamped the group is refused, and
        the rerun opens a correction round first.  What is written is only
        what the results' ``changes`` name (``stored_after``), and it must
        come out as the state the core returned.
        """
        server_changed = False
        while True:
            revision, loaded = self.redis.current
            self.highest, regressed = observe(
                self.highest, revision, loaded, locked=True, server_changed=server_changed
            )
            results: list[Result[Any]] = []
            if regressed is not None:
                COVERAGE.count("regressions_detected")
                results.append(begin_correction(loaded, now, CONFIG, regressed))
            out = op(state_of(results[-1]) if results else loaded)
            results.extend(out if isinstance(out, list) else [out])
            state = state_of(results[-1])
            changes = merge_changes(result.changes for result in results)
            document = bool(changes) and not steady(changes)
            if document and not server_changed and self.redis.stamped_elsewhere:
                COVERAGE.count("server_changes_detected")
                server_changed = True
                continue
            break
        for member_id, member in state.members.items():
            before = loaded.members.get(member_id)
            if member.state is MemberState.FENCED and (
                before is None or before.state is not MemberState.FENCED
            ):
                COVERAGE.count("members_fenced")
        self.copy = self.redis.history[-1]
        if not changes:
            # No change: nothing is written, so the state must be the loaded one.
            assert state == loaded, diff(loaded, state)
            return loaded
        stored = stored_after(loaded, state, changes)
        assert stored == state, ("changes do not describe the step", changes, diff(stored, state))
        mine = upserted_members(changes)
        written = self.redis.commit(revision, stored, document=document, written=mine)
        self.copy = self.redis.history[-1]
        self.highest, _ = observe(self.highest, written, stored, locked=True)
        COVERAGE.count("member_only_writes" if not document else "document_writes")
        return stored

    def heartbeat(
        self, request: HeartbeatRequest, now: int, principal: str | None = None
    ) -> HeartbeatResponse | None:
        """The answer, or None for a refusal (``409 MEMBER_ID_IN_USE``, the
        member limit).  ``principal``: the credential the request came with."""
        answers: list[HeartbeatResponse] = []

        def op(group: GroupMetadata) -> Result[Any]:
            try:
                outcome = handle_heartbeat(
                    group, request.member_id, request, now, CONFIG, principal=principal
                )
            except TooManyMembers:
                COVERAGE.count("joins_over_limit")
                return unchanged(group)
            except Rejected:
                COVERAGE.count("joins_refused")
                return unchanged(group)
            answers.append(outcome.response)
            dropped = [
                c.member_id
                for c in outcome.changes
                if isinstance(c, MemberRemoved) and c.member_id != request.member_id
            ]
            if dropped:
                COVERAGE.count("departed_records_dropped")
            return outcome

        if not self.steady(op, now):
            answers.clear()  # decided again under the mutex
            self.run(op, now)
        return answers[-1] if answers else None

    def tick(self, now: int) -> None:
        """The tick loop: a cheap scan, then a locked tick when something is due."""
        due = next_deadline_ms(self.peek(), CONFIG)
        if due is not None and due <= now:
            self.run(lambda group: tick(group, now, CONFIG), now)

    def drain_work(self, now: int) -> None:
        """The server's loop provisions, probes and retires shards.

        Redis always reports them drained: the simulation checks ownership,
        not message accounting (the end-to-end tests do that).
        """

        def op(group: GroupMetadata) -> list[Result[Any]]:
            work = pending_work(group, now, CONFIG)
            results: list[Result[Any]] = [unchanged(group)]
            if work is None:
                return results
            if work.prepare:
                # Provisioning is idempotent: a rollback of Redis just repeats it.
                results.append(complete_provisioning(group, work.resharding_id, now, CONFIG))
            if work.probe:
                probed = dict.fromkeys(work.probe, True)
                group = state_of(results[-1])
                results.append(apply_drain_probe(group, work.resharding_id, probed, now, CONFIG))
            if work.retire:
                retired = dict.fromkeys(work.retire, True)
                group = state_of(results[-1])
                results.append(apply_retirement(group, work.resharding_id, retired, now, CONFIG))
            return results

        self.run(op, now)


# -- members ----------------------------------------------------------------------


@dataclass
class SimMember:
    member_id: str
    machine: MemberStateMachine | None = None
    #: The process's name: a twin shares the member id with another process.
    label: str = ""
    #: Its handlers hang: draining shards never finish (until it crashes), so
    #: the coordinator's rebalance timeout fences it.
    stalled: bool = False
    #: A network partition: until then no request of this process reaches a
    #: coordinator, while it keeps reading under the lease it already has.
    cut_off_until: int = 0
    #: The credential every request of this process carries.  A twin (another
    #: process given the same member id) uses the same one: deployments share
    #: their secrets.
    principal: str = ""
    #: This start is a reference client: it sends no incarnation, so the
    #: coordinator knows it only by the principal that joined it
    #: (``core.heartbeat.caller_identity``).  Like a KIP-848 client it draws a
    #: member id per start (a static id reused across starts cannot be told
    #: apart from its previous process without an incarnation: a documented
    #: limit of those clients, not modelled).
    reference: bool = False
    twin: bool = False
    starts: int = 0

    def cut_off(self, now: int) -> bool:
        return now < self.cut_off_until

    def start(self, *, reference: bool = False) -> None:
        # The longest local lease the protocol allows: the tightest margins.
        # Every start of our client is a new incarnation, as in the real runtime.
        self.label = self.label or self.member_id
        self.principal = self.principal or f"p-{self.label}"
        self.starts += 1
        self.reference = reference and not self.twin
        if self.reference:
            COVERAGE.count("reference_starts")
            self.member_id = f"{self.label}.{self.starts}"
        elif not self.twin:
            self.member_id = self.label
        self.machine = MemberStateMachine(
            self.member_id,
            lease_ms=CONFIG.member_lease_ttl_ms,
            incarnation=None if self.reference else new_incarnation(),
        )

    @property
    def alive(self) -> bool:
        return self.machine is not None

    def holding(self, now: int) -> frozenset[int]:
        """Shards this member may read, or still processes entries of under its lease.

        A draining shard has entries in flight until ``drained``; the member
        works on them only while its lease is valid (past it the coordinator
        may already have handed the shard on, and the runtime stops).
        """
        machine = self.machine
        if machine is None:
            return frozenset()
        held = set(machine.readable(now))
        if machine.lease_valid(now):
            held |= machine.draining
        return frozenset(held)


@dataclass
class Held:
    """A request held up on the wire."""

    request: HeartbeatRequest
    #: How many snapshots Redis held when it was sent.
    sent_at: int
    #: Redis has since lost writes made before it was sent (the sender may
    #: have heard of them).
    lost: bool = False
    #: The snapshot whose write issued the epoch the request carries (None for
    #: a join or a leave).
    origin: Snapshot | None = None
    #: The credential it was sent with.
    principal: str | None = None

    def from_lost_history(self, redis: Redis) -> bool:
        """The epoch it carries was issued by a write Redis no longer has: the
        request comes from a history that is gone, whatever its numbers say."""
        origin = self.origin
        return origin is not None and not any(s is origin for s in redis.history)


@dataclass
class Network:
    delayed: list[Held] = field(default_factory=list)
    #: A copy of each of the latest requests, taking the long way (a retry by
    #: a proxy, a duplicated packet).  When Redis loses writes, the copies sent
    #: since join ``delayed`` and arrive late.
    copies: deque[Held] = field(default_factory=lambda: deque(maxlen=COPIES_KEPT))

    def hold(
        self,
        request: HeartbeatRequest,
        redis: Redis,
        origin: Snapshot | None,
        principal: str | None = None,
        *,
        copy: bool = False,
    ) -> None:
        """Delay ``request`` (it arrives late instead of now), or with ``copy``
        keep a copy of a request that was also delivered."""
        held = Held(request, len(redis.history), origin=origin, principal=principal)
        (self.copies if copy else self.delayed).append(held)

    def history_lost_from(self, index: int) -> None:
        """Redis kept only its first ``index`` snapshots."""
        for held in self.delayed:
            if held.sent_at > index:
                held.lost = True
        self.delayed.extend(
            Held(c.request, c.sent_at, lost=True, origin=c.origin, principal=c.principal)
            for c in self.copies
            if c.sent_at > index
        )
        self.copies.clear()


def reference_principal(member_id: str) -> str | None:
    """The credential of the reference client that drew ``member_id`` (None:
    not such an id).  ``SimMember.start`` draws ``<label>.<start>``."""
    label, dot, _ = member_id.rpartition(".")
    return f"p-{label}" if dot else None


def reported(request: HeartbeatRequest) -> set[int]:
    """Shards a report says the member still reads or still has work in flight for."""
    shards = {s.shard_index for s in request.owned_shards}
    for report_ in request.revoking_shards:
        if report_.shard is None:
            continue
        if report_.state is not RevokingShardState.REVOKED or report_.in_flight:
            shards.add(report_.shard.shard_index)
    return shards
