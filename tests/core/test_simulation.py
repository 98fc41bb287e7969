"""Simulation: the real core and real member state machines under random faults.

Hypothesis drives five members, two coordinator processes sharing one Redis
(each keeping its own highest-seen revision, as the server's store does) and a
lossy network.  Schedules alternate calm stretches (rounds of heartbeats in
which members keep several shards, hand them over and drain them) with fault
bursts: lost requests and answers, late duplicates, slow round trips, member
crashes and restarts, time jumps past leases and rebalance timeouts, reshards
and Redis losing its latest writes.

Checked after every step and after every heartbeat of a calm stretch: no shard
is *held* by two members at once, where holding means the member may read the
shard, or still has entries of it in flight under a valid lease.  Checked on
every late delivery: a late or stale report never takes a shard from its
holder.  After the faults stop every shard must settle on exactly one live
reader with a balanced spread within a bounded number of heartbeat rounds.

Each run prints one ``simulation coverage:`` line (at the end of the pytest
session) saying how many checks happened in the states that matter, and fails
when those are too rare to prove anything.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import hypothesis
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import streamkit.consumer.member as member_module
from streamkit.consumer.member import MemberStateMachine, ReactionKind, new_incarnation
from streamkit.protocol import (
    HeartbeatRequest,
    HeartbeatResponse,
    MemberState,
    RevokingShardState,
    RuntimeConsumerCapacity,
)
from streamkit_server.core import (
    CoordinatorConfig,
    GroupMetadata,
    ReshardingRejected,
    Result,
    apply_drain_probe,
    apply_retirement,
    begin_correction,
    complete_provisioning,
    handle_heartbeat,
    new_group,
    next_deadline_ms,
    pending_work,
    start_resharding,
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
from streamkit_server.store import WRITE_LOG_SIZE

from .coverage import SimulationCoverage, report

CONFIG = CoordinatorConfig(
    heartbeat_interval_ms=100,
    member_lease_ttl_ms=500,
    rebalance_timeout_ms=600,
    producer_routing_lease_ms=300,
)
# More members than shards: every shard is wanted by someone, so most checks
# happen while several members hold shards and handoffs are under way.
MEMBERS = ("m0", "m1", "m2", "m3", "m4")
SHARDS = 4
PROCESSES = ("c0", "c1")
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
        """The steady-write script's check (``store._STEADY_PRELUDE``): ``copy`` is
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

    def heartbeat(self, request: HeartbeatRequest, now: int) -> HeartbeatResponse | None:
        """The answer, or None for a refusal (``409 MEMBER_ID_IN_USE``)."""
        answers: list[HeartbeatResponse] = []

        def op(group: GroupMetadata) -> Result[Any]:
            try:
                outcome = handle_heartbeat(group, request.member_id, request, now, CONFIG)
            except Rejected:
                COVERAGE.count("joins_refused")
                return unchanged(group)
            answers.append(outcome.response)
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

    def cut_off(self, now: int) -> bool:
        return now < self.cut_off_until

    def start(self) -> None:
        # The longest local lease the protocol allows: the tightest margins.
        # Every start is a new incarnation, as in the real runtime.
        self.label = self.label or self.member_id
        self.machine = MemberStateMachine(
            self.member_id, lease_ms=CONFIG.member_lease_ttl_ms, incarnation=new_incarnation()
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
class Network:
    delayed: list[HeartbeatRequest] = field(default_factory=list)


def reported(request: HeartbeatRequest) -> set[int]:
    """Shards a report says the member still reads or still has work in flight for."""
    shards = {s.shard_index for s in request.owned_shards}
    for report_ in request.revoking_shards:
        if report_.shard is None:
            continue
        if report_.state is not RevokingShardState.REVOKED or report_.in_flight:
            shards.add(report_.shard.shard_index)
    return shards


class ProtocolSimulation(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        COVERAGE.count("examples")
        self.now = 0
        self.redis = Redis([Snapshot(1, new_group("orders", "billing", SHARDS, 0))])
        self.processes = [CoordinatorProcess(name, self.redis) for name in PROCESSES]
        self.members = {m: SimMember(m) for m in MEMBERS}
        self.network = Network()
        self.reshards = 0
        self.undetected_rollback = False
        # The member each shard was last held by, to count completed handoffs.
        self.last_holder: dict[int, str] = {}
        for member in self.members.values():
            member.start()

    # -- plumbing -----------------------------------------------------------------

    def _process(self, index: int) -> CoordinatorProcess:
        """The coordinator process a request lands on.

        Until a process that saw the lost writes has loaded Redis under the
        mutex (and so opened a correction round), requests go to such a
        witness: a process that never saw them has no way to notice, and may
        grant a shard whose forgotten holder still reads.  That gap is real;
        ``test_a_rollback_only_another_process_saw`` pins it down.
        """
        if self.undetected_rollback:
            revision = self.redis.current[0]
            witnesses = [p for p in self.processes if p.highest and p.highest.revision > revision]
            if witnesses:
                return witnesses[index % len(witnesses)]
            self.undetected_rollback = False
        return self.processes[index % len(self.processes)]

    def _answer(self, machine: MemberStateMachine, response: HeartbeatResponse) -> None:
        # The arrival time of the answer, for the mutant that counts the member
        # lease from it (scripts/mutants.py); the real member never reads it.
        member_module.SIM_ARRIVAL_MS = self.now  # type: ignore[attr-defined]
        for reaction in machine.on_response(response):
            assert reaction.kind is not ReactionKind.REJECTED, response
            if reaction.kind is ReactionKind.LOST:
                COVERAGE.count("fenced")

    def _send(self, member: SimMember, fate: str, process: int = 0) -> None:
        machine = member.machine
        assert machine is not None
        request = machine.next_request(self.now, in_flight={s: 1 for s in machine.draining})
        if fate == "lose_request" or member.cut_off(self.now):
            machine.request_failed()
            return
        if fate == "delay":
            # The client times out and moves on; the request arrives later.
            self.network.delayed.append(request)
            machine.request_failed()
            return
        response = self._process(process).heartbeat(request, self.now)
        if fate == "lose_response" or response is None:
            machine.request_failed()
            return
        self._answer(machine, response)

    # -- calm stretches -------------------------------------------------------------

    @rule(rounds=st.integers(2, 10), data=st.data())
    def calm_stretch(self, rounds: int, data: st.DataObject) -> None:
        """Rounds of heartbeats without faults: members take, hold and hand over shards.

        Drains finish only some of the time, so revokes stay in flight across
        rounds, and the invariant is checked after every single heartbeat.
        """
        self._stretch(rounds, data, noisy=False)

    @rule(rounds=st.integers(2, 10), data=st.data())
    def busy_stretch(self, rounds: int, data: st.DataObject) -> None:
        """The same rounds, with now and then a heartbeat held up on the wire and
        late ones arriving: stale reports land while members hold shards."""
        self._stretch(rounds, data, noisy=True)

    @rule(rounds=st.integers(2, 10), data=st.data())
    def spread_stretch(self, rounds: int, data: st.DataObject) -> None:
        """Rounds in which every heartbeat lands on either process, as behind a
        load balancer: each process's copy falls behind the other's member
        writes, and steady writes pass them (the store's catch-up)."""
        self._stretch(rounds, data, noisy=False, spread=True)

    def _stretch(
        self, rounds: int, data: st.DataObject, *, noisy: bool, spread: bool = False
    ) -> None:
        fates = ["ok"] * 5 + ["delay"] if noisy else ["ok"]
        for _ in range(rounds):
            self.now += data.draw(st.integers(40, CONFIG.heartbeat_interval_ms), label="dt")
            process = data.draw(st.integers(0, len(PROCESSES) - 1), label="process")
            self._process(process).tick(self.now)
            self._process(process).drain_work(self.now)
            # A fresh order every round: who heartbeats first after a timeout
            # decides who sees a released shard first.
            order: list[str] = data.draw(st.permutations(sorted(self.members)), label="order")
            for label in order:
                sim = self.members[label]
                machine = sim.machine
                if machine is None:
                    continue
                if machine.draining and not sim.stalled:
                    finished: bool = data.draw(st.integers(0, 2), label="drained") == 0
                    for shard in sorted(machine.draining) if finished else []:
                        machine.drained(shard)
                if spread:
                    process = data.draw(st.integers(0, len(PROCESSES) - 1), label="process")
                self._send(sim, data.draw(st.sampled_from(fates), label="fate"), process)
                self.no_shard_held_twice()
                if noisy and self.network.delayed and data.draw(st.booleans(), label="late"):
                    self.deliver_late_duplicate(data, process)
                    self.no_shard_held_twice()

    # -- fault bursts ---------------------------------------------------------------

    @rule(
        member=st.sampled_from(MEMBERS),
        fate=st.sampled_from(["ok", "lose_request", "lose_response", "delay"]),
        process=st.integers(0, len(PROCESSES) - 1),
    )
    def heartbeat(self, member: str, fate: str, process: int) -> None:
        sim = self.members[member]
        if sim.alive:
            self._send(sim, fate, process)

    @rule(
        member=st.sampled_from(MEMBERS),
        to_server=st.integers(0, 600),
        to_client=st.integers(0, 600),
        process=st.integers(0, len(PROCESSES) - 1),
    )
    def slow_heartbeat(self, member: str, to_server: int, to_client: int, process: int) -> None:
        """A heartbeat whose request and answer each spend a while on the wire."""
        sim = self.members[member]
        machine = sim.machine
        if machine is None:
            return
        request = machine.next_request(self.now, in_flight={s: 1 for s in machine.draining})
        if sim.cut_off(self.now):
            machine.request_failed()
            return
        self.now += to_server
        self.no_shard_held_twice()
        response = self._process(process).heartbeat(request, self.now)
        self.now += to_client
        self.no_shard_held_twice()
        if response is None:
            machine.request_failed()
            return
        self._answer(machine, response)

    @rule(member=st.sampled_from(MEMBERS))
    def delayed_heartbeat(self, member: str) -> None:
        """A heartbeat stuck on the wire: the member gives up on it, it arrives later."""
        if self.members[member].alive:
            self._send(self.members[member], "delay")

    @precondition(lambda self: bool(self.network.delayed))
    @rule(data=st.data(), process=st.integers(0, len(PROCESSES) - 1))
    def deliver_late_duplicate(self, data: st.DataObject, process: int) -> None:
        index = data.draw(st.integers(0, len(self.network.delayed) - 1))
        self.deliver_late_duplicate_of(self.network.delayed.pop(index), process)

    def deliver_late_duplicate_of(self, request: HeartbeatRequest, process: int) -> None:
        # What the heartbeat will see once due timeouts are applied.
        base = state_of(tick(self.redis.current[1], self.now, CONFIG))
        self._process(process).heartbeat(request, self.now)  # nobody listens for the answer
        self.late_report_moves_nothing(request, base, self.redis.current[1])

    @rule(dt=st.one_of(st.integers(1, 150), st.integers(1, 2_000)))
    def advance_time(self, dt: int) -> None:
        self.now += dt

    @rule(process=st.integers(0, len(PROCESSES) - 1))
    def coordinator_tick(self, process: int) -> None:
        self._process(process).tick(self.now)

    @precondition(lambda self: sum(m.alive for m in self.members.values()) > 2)
    @rule(member=st.sampled_from(MEMBERS))
    def crash(self, member: str) -> None:
        # A dead process reads nothing; its coordinator state lingers.
        self.members[member].machine = None
        self.members[member].stalled = False

    @precondition(lambda self: any(not m.alive for m in self.members.values()))
    @rule(member=st.sampled_from(MEMBERS))
    def restart(self, member: str) -> None:
        if not self.members[member].alive:
            self.members[member].start()

    @rule(shards=st.integers(1, 6), ordered=st.booleans(), process=st.integers(0, 1))
    def reshard(self, shards: int, ordered: bool, process: int) -> None:
        """An operator scales the stream; provisioning is done by the next drain work."""
        self.reshards += 1
        rid = f"r{self.reshards}"
        coordinator = self._process(process)

        def op(group: GroupMetadata) -> Result[Any]:
            try:
                return start_resharding(group, shards, self.now, resharding_id=rid, ordered=ordered)
            except ReshardingRejected:
                return unchanged(group)

        coordinator.run(op, self.now)
        coordinator.drain_work(self.now)

    def partition(self, label: str, duration: int) -> None:
        """The member is cut off from every coordinator process for a while.

        Its heartbeats are lost; it keeps reading what it has until its local
        lease runs out, while the others go on heartbeating.
        """
        sim = self.members[label]
        if sim.alive:
            sim.cut_off_until = max(sim.cut_off_until, self.now + duration)
            COVERAGE.count("partitions")

    @precondition(lambda self: not any(m.stalled for m in self.members.values()))
    @rule(member=st.sampled_from(MEMBERS))
    def stall(self, member: str) -> None:
        """The member's handlers hang for good: it will hit the rebalance timeout.

        One at a time, and until the teardown: a member must stay stalled (and
        alive) for a whole rebalance timeout to get fenced.
        """
        self.members[member].stalled = True

    @precondition(lambda self: self._may_lose_writes())
    @rule(back=st.one_of(st.integers(1, 4), st.integers(5, 200)), failover=st.booleans())
    def redis_rollback(self, back: int, failover: bool) -> None:
        """Redis loses its most recent writes: a failover or restart (another
        server incarnation), or a restore on the same one."""
        self._lose_writes_from(len(self.redis.history) - back, failover=failover)

    @precondition(lambda self: self._may_lose_writes())
    @rule(failover=st.booleans())
    def redis_restore_before_handoff(self, failover: bool) -> None:
        """Redis comes back from a snapshot taken before the latest handoff.

        Random rollbacks rarely cut exactly there, and it is the sharpest case:
        the member that gave the shard up is its owner (and target) again in
        Redis, while the new owner still reads it.
        """
        history = self.redis.history
        for shard, holder in sorted(history[-1][1].owners.items()):
            first = len(history) - 1
            while first > 0 and history[first - 1][1].target.get(shard) == holder:
                first -= 1
            before = history[first - 1][1].owners.get(shard) if first > 0 else None
            if before is not None and before != holder:
                COVERAGE.count("restored_before_handoffs")
                self._lose_writes_from(first, failover=failover)
                return

    @precondition(
        lambda self: (
            self._may_lose_writes()
            and any(snapshot.group.correction for snapshot in self.redis.history[1:-1])
        )
    )
    @rule(cut_off_for=st.integers(100, 1_000), data=st.data())
    def redis_restore_open_round(self, cut_off_for: int, data: st.DataObject) -> None:
        """A zone fails: Redis fails over to a lagging replica, which holds a
        snapshot taken while a correction round was open, and the members in
        that zone are cut off from the coordinators for a while.

        The restored round may have begun more than a lease ago, while the
        heartbeats Redis now forgets renewed the members' leases: a member cut
        off reads on, and Redis soon believes its lease is over.  The round
        must wait a lease from the moment this new regression is noticed, not
        from its old start.  The sharpest snapshot comes first when there is
        one (the round had closed after it and shards had moved again), then
        one of a round already open for a lease, then any.
        """
        readers = sorted(label for label, sim in self.members.items() if sim.holding(self.now))
        zone = data.draw(st.sets(st.sampled_from(readers), max_size=2)) if readers else set()
        for label in sorted(zone):
            self.partition(label, cut_off_for)
        history = self.redis.history
        index = self._open_round_before_moves()
        if index is None:
            inside = [i for i in range(1, len(history) - 1) if history[i][1].correction]
            index = data.draw(st.sampled_from(self._old_round_recent_snapshots() or inside))
        COVERAGE.count("restored_inside_rounds")
        if any(snapshot.group.correction is None for snapshot in history[index + 1 :]):
            COVERAGE.count("restored_open_rounds")  # the round had closed since: it reopens
        self._lose_writes_from(index + 1, failover=True)

    def _old_round_recent_snapshots(self) -> list[int]:
        """Snapshots of a round open for a lease already, taken less than a lease ago.

        The members are still live in them, so the round can close as soon as
        they resynchronise, while a member cut off reads on a lease renewed by
        heartbeats the snapshot does not have.
        """
        ttl = CONFIG.member_lease_ttl_ms
        found = []
        for i, (_, group, *_) in enumerate(self.redis.history[1:-1], start=1):
            round_ = group.correction
            taken = max((m.last_heartbeat_ms for m in group.members.values()), default=0)
            if round_ and round_.started_at_ms + ttl <= self.now < taken + ttl:
                found.append(i)
        return found

    def _open_round_before_moves(self) -> int | None:
        """The latest snapshot with a round open, after which the round closed
        and a shard now read by one member was the target of another."""
        history = self.redis.history
        owners = history[-1][1].owners
        closed = [i for i in range(1, len(history)) if history[i][1].correction is None]
        for i in range(len(history) - 2, 0, -1):
            group = history[i][1]
            if group.correction is None or not any(j > i for j in closed):
                continue
            # Sharpest when a shard now read by one member goes to another,
            # and the reader is known there (so it drains instead of being
            # told at once that it is unknown).
            if any(
                group.target.get(s) not in (None, h) and h in group.live_member_ids()
                for s, h in owners.items()
            ):
                return i
        return None

    def _may_lose_writes(self) -> bool:
        """Redis has writes to lose, and no partition is under way: one failover
        per incident, so that a member cut off by one reads on through the
        stretch that follows (a second rollback would open a fresh round that
        hides how the first one was handled)."""
        cut_off = any(sim.cut_off(self.now) for sim in self.members.values())
        return len(self.redis.history) > 1 and not cut_off

    def _lose_writes_from(self, index: int, *, failover: bool) -> None:
        del self.redis.history[max(1, index) :]
        if failover:
            # Another server incarnation: any process notices at its first
            # document write (the stamp), witness or not.
            self.redis.server += 1
            COVERAGE.count("failovers")
        else:
            self.undetected_rollback = True
        COVERAGE.count("rollbacks")

    # -- identity faults ------------------------------------------------------------

    @precondition(lambda self: not any(sim.label != sim.member_id for sim in self.members.values()))
    @rule(member=st.sampled_from(MEMBERS))
    def start_twin(self, member: str) -> None:
        """A second process with the same (static) member id, another incarnation."""
        twin = SimMember(member, label=f"{member}'")
        twin.start()
        self.members[twin.label] = twin
        COVERAGE.count("twins")

    @precondition(lambda self: any(sim.label != sim.member_id for sim in self.members.values()))
    @rule()
    def stop_twin(self) -> None:
        for label in [k for k, sim in self.members.items() if sim.label != sim.member_id]:
            del self.members[label]  # a crash: whatever it held lingers in Redis

    @rule(member=st.sampled_from(MEMBERS), duplicate=st.booleans(), process=st.integers(0, 1))
    def graceful_stop(self, member: str, duplicate: bool, process: int) -> None:
        """Drain, leave (-1), exit; a copy of the leave may arrive much later,
        after a restart (a new incarnation) took the member id again."""
        sim = self.members[member]
        machine = sim.machine
        if machine is None or sim.stalled:
            return
        machine.stop()
        for shard in sorted(machine.draining):
            machine.drained(shard)
        request = machine.leave_request(self.now)
        if duplicate:
            self.network.delayed.append(request)
        if not sim.cut_off(self.now):  # else the leave is lost: its shards wait for expiry
            self._process(process).heartbeat(request, self.now)
        sim.machine = None
        COVERAGE.count("graceful_stops")

    @rule(
        member=st.sampled_from(MEMBERS),
        incarnation=st.sampled_from([None, "forged"]),
        process=st.integers(0, 1),
    )
    def forged_leave(self, member: str, incarnation: str | None, process: int) -> None:
        """Anyone who reaches the member API sends a leave for someone else's id."""
        request = HeartbeatRequest(
            protocol_version=1,
            request_id="forged",
            member_id=member,
            member_epoch=-1,
            metadata_version=self.redis.current[1].metadata_version,
            runtime_consumer_capacity=RuntimeConsumerCapacity(
                runtime_max_concurrency=1, available_concurrency=1
            ),
            incarnation=incarnation,
        )
        COVERAGE.count("forged_leaves")
        self.deliver_late_duplicate_of(request, process)

    # -- the safety properties --------------------------------------------------------

    @invariant()
    def no_shard_held_twice(self) -> None:
        if not hasattr(self, "members"):
            return
        holders: dict[int, str] = {}
        for sim in self.members.values():
            for shard in sim.holding(self.now):
                assert shard not in holders, (
                    f"shard {shard} held by {holders[shard]} and {sim.label} at {self.now}: "
                    f"{self._describe()}"
                )
                holders[shard] = sim.label
        self._measure(holders)

    def late_report_moves_nothing(
        self, request: HeartbeatRequest, base: GroupMetadata, after: GroupMetadata
    ) -> None:
        """Checked on every late delivery, whatever its epoch.

        A shard leaves its holder only on the holder's own current-epoch report
        that no longer lists it; a shard is granted only to the sender, only as
        its target, and only on a join or a current-epoch report.
        """
        COVERAGE.count("late_deliveries_checked")
        sender = request.member_id
        member = base.members.get(sender)
        current = (
            member is not None
            and member.live
            and member.incarnation == request.incarnation
            and request.member_epoch == member.member_epoch
        )
        # A leave carrying the member's incarnation is true whenever it arrives:
        # that start of the process drained and reads nothing, ever again (a
        # process that rejoins draws a new incarnation first).
        own_leave = (
            request.member_epoch < 0
            and request.incarnation is not None
            and member is not None
            and member.incarnation == request.incarnation
        )
        still = reported(request)
        for shard, owner in base.owners.items():
            now_owner = after.owners.get(shard)
            if now_owner == owner:
                continue
            releasable = current or own_leave
            assert owner == sender and releasable and shard not in still and now_owner is None, (
                f"late {request} moved shard {shard} from {owner} to {now_owner}"
            )
        for shard, owner in after.owners.items():
            if base.owners.get(shard) == owner:
                continue
            assert (
                owner == sender
                and after.target.get(shard) == sender
                and (current or request.member_epoch == 0)
            ), f"late {request} granted shard {shard} to {owner}"

    def _measure(self, holders: dict[int, str]) -> None:
        """Record what state this check happened in (the coverage line)."""
        COVERAGE.count("checks")
        if len(set(holders.values())) >= 2:
            COVERAGE.count("contended")
        for shard, holder in holders.items():
            previous = self.last_holder.get(shard)
            if previous is not None and previous != holder:
                COVERAGE.count("handoffs")
            self.last_holder[shard] = holder
        lease_draining = any(
            sim.machine is not None and sim.machine.draining and sim.machine.lease_valid(self.now)
            for sim in self.members.values()
        )
        if lease_draining:
            COVERAGE.count("revokes_in_flight")
        group = self.redis.current[1]
        if group.correction is not None and holders:
            COVERAGE.count("corrections_with_holders")
            if any(self._reads_on_forgotten_lease(sim, group) for sim in self.members.values()):
                COVERAGE.count("forgotten_leases_cut_off")
        migration = group.active_migration()
        if migration is not None:
            old = set(migration.previous_layout) - set(migration.new_layout)
            old |= set(migration.removed_shards)
            if holders.keys() & old and holders.keys() & set(migration.new_layout):
                COVERAGE.count("reshards_both_layouts")

    def _reads_on_forgotten_lease(self, sim: SimMember, group: GroupMetadata) -> bool:
        """A cut-off member holds shards on a lease renewed by heartbeats Redis lost.

        Redis' record of its last heartbeat is older than the send time of the
        answer its lease runs from (or the record is gone).
        """
        machine = sim.machine
        if machine is None or not sim.cut_off(self.now) or not sim.holding(self.now):
            return False
        assert machine.lease_until_ms is not None  # it holds shards
        stored = group.members.get(sim.member_id)
        if stored is None or not stored.live or stored.incarnation != machine.incarnation:
            return True
        return machine.lease_until_ms > stored.last_heartbeat_ms + CONFIG.member_lease_ttl_ms

    # -- liveness once the faults stop --------------------------------------------

    def teardown(self) -> None:
        if not hasattr(self, "members"):
            return
        self.stop_twin()  # a twin never joins while its member id is live
        if not any(m.alive for m in self.members.values()):
            self.members["m0"].start()
        self.network.delayed.clear()
        for sim in self.members.values():
            sim.stalled = False
            sim.cut_off_until = 0
        for round_ in range(CONVERGENCE_ROUNDS):
            self.now += CONFIG.heartbeat_interval_ms
            process = self._process(round_)
            process.tick(self.now)
            process.drain_work(self.now)
            for sim in self.members.values():
                if sim.machine is None:
                    continue
                for shard in list(sim.machine.draining):
                    sim.machine.drained(shard)
                self._send(sim, "ok", round_)
            self.no_shard_held_twice()
            if self._settled():
                return
        raise AssertionError(
            f"not settled after {CONVERGENCE_ROUNDS} fault-free rounds: "
            f"{self._readers()} group={self.redis.current[1].model_dump()}"
        )

    def _describe(self) -> str:
        members = {
            sim.label: (
                sim.machine.epoch,
                sorted(sim.machine.reading),
                sorted(sim.machine.draining),
                sim.machine.lease_until_ms,
            )
            for sim in self.members.values()
            if sim.machine is not None
        }
        group = self.redis.current[1]
        stored = {
            m: (meta.state.value, meta.member_epoch, meta.last_heartbeat_ms, meta.fenced_at_ms)
            for m, meta in group.members.items()
        }
        return (
            f"members (epoch, reading, draining, lease until)={members} "
            f"owners={group.owners} target={group.target} stored members={stored} "
            f"correction={group.correction}"
        )

    def _readers(self) -> dict[str, list[int]]:
        return {
            sim.label: sorted(sim.machine.readable(self.now))
            for sim in self.members.values()
            if sim.machine is not None
        }

    def _settled(self) -> bool:
        readers = self._readers()
        counts = [len(shards) for shards in readers.values()]
        covered = sorted(s for shards in readers.values() for s in shards)
        group = self.redis.current[1]
        return (
            group.active_migration() is None
            and covered == sorted(group.layout)
            and max(counts) - min(counts) <= 1
        )


# -- the tests --------------------------------------------------------------------

# The fixed schedules CI replays on every run (STREAMKIT_SIM_EXAMPLES=5000 is
# the deep run to do after touching the core), then a fresh batch.
EXAMPLES = int(os.environ.get("STREAMKIT_SIM_EXAMPLES", "200"))
FRESH_EXAMPLES = int(os.environ.get("STREAMKIT_SIM_FRESH_EXAMPLES", "50"))
STEPS = int(os.environ.get("STREAMKIT_SIM_STEPS", "40"))

#: Minimum share of checks made while two or more members hold shards.
MIN_CONTENDED = 0.3
#: Every state below must be visited at least once per run.
REQUIRED = (
    "handoffs",
    "revokes_in_flight",
    "corrections_with_holders",
    "reshards_both_layouts",
    "late_deliveries_checked",
    "regressions_detected",
    "fenced",
    "members_fenced",
    "restored_before_handoffs",
    "restored_open_rounds",
    "restored_inside_rounds",
    "partitions",
    "forgotten_leases_cut_off",
    "twins",
    "joins_refused",
    "graceful_stops",
    "forged_leaves",
    "failovers",
    "server_changes_detected",
    "member_only_writes",
    "document_writes",
    "steady_catch_ups",
)


def _settings(**extra: object) -> settings:
    # scripts/mutants.py measures the time to the first failing schedule.
    shrink = os.environ.get("STREAMKIT_SIM_SHRINK", "1") != "0"
    phases = [p for p in Phase if shrink or p is not Phase.shrink]
    return settings(
        phases=phases,
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        **extra,  # type: ignore[arg-type]
    )


def _run(
    label: str,
    run_settings: settings,
    factory: type[ProtocolSimulation] = ProtocolSimulation,
) -> None:
    COVERAGE.reset()
    run_state_machine_as_test(factory, settings=run_settings)
    report(f"simulation coverage ({label}): {COVERAGE.line()}")


def test_fixed_schedules() -> None:
    """The same schedules on every run, so a landing never hinges on luck.

    The coverage minimums are asserted here, where they are deterministic; a
    small fresh batch may by chance spend less time in contended states.
    """
    _run("fixed", _settings(derandomize=True, database=None))
    assert COVERAGE.fraction("contended") >= MIN_CONTENDED, COVERAGE.line()
    missing = [name for name in REQUIRED if not COVERAGE[name]]
    assert not missing, f"never reached {missing}: {COVERAGE.line()}"


def test_fresh_schedules() -> None:
    """New schedules every run; the seed is printed and replays the batch."""
    seed = int(os.environ.get("STREAMKIT_SIM_SEED") or random.SystemRandom().randrange(2**32))
    report(f"simulation seed: STREAMKIT_SIM_SEED={seed} (replays this batch)")
    fresh = settings(_settings(database=None), max_examples=FRESH_EXAMPLES)

    @hypothesis.seed(seed)
    class Seeded(ProtocolSimulation):
        pass

    try:
        _run(f"fresh, STREAMKIT_SIM_SEED={seed}", fresh, Seeded)
    except AssertionError as exc:
        raise AssertionError(f"replay with STREAMKIT_SIM_SEED={seed}: {exc}") from exc


def _grant_lost_then_other_process_serves(*, failover: bool) -> None:
    """Redis forgets a grant that one process made; the other process serves next.

    m3 joins through c0 and reads every shard.  Redis loses that write; m2
    then joins through c1, which never saw it.  Nothing reports the
    regression to c1 by revisions: c0 would notice only on its next load, m3
    only on its next heartbeat.
    """
    machine = ProtocolSimulation()
    machine.setup()
    c0, c1 = machine.processes
    for sim in machine.members.values():
        sim.machine = None
    m3, m2 = MemberStateMachine("m3", lease_ms=500), MemberStateMachine("m2", lease_ms=500)
    machine.members["m3"].machine, machine.members["m2"].machine = m3, m2
    for _ in range(2):  # join, then the heartbeat that is granted every shard
        machine._answer(m3, answered(c0.heartbeat(m3.next_request(machine.now), machine.now)))
    assert m3.readable(machine.now) == frozenset(range(SHARDS))
    del machine.redis.history[1:]  # Redis loses m3's join and grants
    if failover:
        machine.redis.server += 1
    for _ in range(2):
        machine._answer(m2, answered(c1.heartbeat(m2.next_request(machine.now), machine.now)))
    machine.no_shard_held_twice()


def test_a_failover_that_lost_a_grant_only_another_process_saw() -> None:
    """The former known gap: c1's first document write (m2's join) finds the
    group stamped by the previous server, so it opens a correction round and
    grants nothing while m3's lease may run."""
    _grant_lost_then_other_process_serves(failover=True)


@pytest.mark.xfail(
    strict=True,
    reason="known gap: a same-server restore that only another process saw is invisible",
)
def test_a_same_server_restore_only_another_process_saw() -> None:
    """What stays open: the same case when the Redis process does not change
    (DEBUG RELOAD, a RESTORE of the key).  No stamp differs and c1 never saw
    the lost revision, so it grants the shards m3 still reads."""
    _grant_lost_then_other_process_serves(failover=False)


def test_a_late_previous_epoch_report_releases_nothing() -> None:
    """A schedule the random search reaches only now and then, pinned.

    m0 sends a heartbeat that is held up on the wire, then is granted m1's
    shards (a new epoch).  A correction round opens (Redis lost a write), so
    nothing is granted back.  The held-up report, one epoch old, arrives: it
    must be answered with the current view, not reconciled as if current
    (which would release the shards m0 now reads).
    """
    machine = ProtocolSimulation()
    machine.setup()
    c0 = machine.processes[0]
    for sim in machine.members.values():
        sim.machine = None
    m0, m1 = MemberStateMachine("m0", lease_ms=500), MemberStateMachine("m1", lease_ms=500)
    machine.members["m0"].machine, machine.members["m1"].machine = m0, m1

    def beat(member: MemberStateMachine) -> None:
        request = member.next_request(machine.now, in_flight={s: 1 for s in member.draining})
        machine._answer(member, answered(c0.heartbeat(request, machine.now)))
        machine.no_shard_held_twice()

    for _ in range(4):  # both join and settle on two shards each
        beat(m0)
        beat(m1)
        for member in (m0, m1):
            for shard in list(member.draining):
                member.drained(shard)
        machine.now += 100
    assert len(m0.reading) == len(m1.reading) == SHARDS // 2
    machine.members["m1"].machine = None  # m1 crashes
    held_up = m0.next_request(machine.now)
    m0.request_failed()
    for _ in range(7):  # m1's lease runs out; m0 is granted everything
        machine.now += 100
        beat(m0)
    assert m0.reading == set(range(SHARDS))
    assert held_up.member_epoch == machine.redis.current[1].members["m0"].previous_member_epoch
    del machine.redis.history[-1:]  # Redis loses m0's last heartbeat
    machine.now += 50
    machine.deliver_late_duplicate_of(held_up, 0)
    machine.no_shard_held_twice()


def test_a_restore_from_before_a_handoff_starts_nothing_new() -> None:
    """Pinned: Redis restores a snapshot from before m0 handed shards to m1.

    In Redis m0 owns (and is the target of) every shard again, while m1 still
    reads the two it was given.  m0's answer during the correction round is
    SYNC_METADATA: it may keep what it reads and must start nothing else.
    """
    machine = ProtocolSimulation()
    machine.setup()
    c0 = machine.processes[0]
    for sim in machine.members.values():
        sim.machine = None
    m0, m1 = MemberStateMachine("m0", lease_ms=500), MemberStateMachine("m1", lease_ms=500)
    machine.members["m0"].machine = m0

    def beat(member: MemberStateMachine) -> None:
        request = member.next_request(machine.now, in_flight={s: 1 for s in member.draining})
        machine._answer(member, answered(c0.heartbeat(request, machine.now)))
        machine.no_shard_held_twice()

    beat(m0)
    beat(m0)
    before_handoff = len(machine.redis.history)
    machine.members["m1"].machine = m1
    beat(m1)
    machine.now += 50
    beat(m0)
    for shard in list(m0.draining):
        m0.drained(shard)
    beat(m0)
    beat(m1)
    machine.now += 50
    beat(m0)
    beat(m1)
    assert m1.reading and m0.reading.isdisjoint(m1.reading)
    del machine.redis.history[before_handoff:]
    machine.now += 50
    beat(m0)  # SYNC_METADATA from the process that saw the lost writes
