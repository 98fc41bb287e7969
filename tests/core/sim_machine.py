"""The protocol simulation as a Hypothesis state machine (see ``test_simulation``)."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import streamkit.consumer.member as member_module
from streamkit.consumer.member import MemberStateMachine, ReactionKind
from streamkit.protocol import (
    HeartbeatRequest,
    HeartbeatResponse,
    RuntimeConsumerCapacity,
)
from streamkit_server.core import (
    GroupMetadata,
    ReshardingRejected,
    ReshardingSpec,
    Result,
    assign,
    new_group,
    start_resharding,
    tick,
)
from streamkit_server.core.limits import RECORDS_PER_MEMBER_SLOT

from .sim_world import (
    CONFIG,
    CONVERGENCE_ROUNDS,
    COVERAGE,
    MEMBERS,
    PROCESSES,
    SHARDS,
    CoordinatorProcess,
    Held,
    Network,
    Redis,
    SimMember,
    Snapshot,
    reference_principal,
    reported,
    state_of,
    unchanged,
)


class ProtocolSimulation(RuleBasedStateMachine):
    @initialize(reference=st.sets(st.sampled_from(MEMBERS), max_size=2))
    def setup(self, reference: frozenset[str] | set[str] = frozenset()) -> None:
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
        # (member id, incarnation, epoch) -> the snapshot whose write issued it,
        # as the member heard it: ground truth the coordinator does not have.
        self.epoch_origin: dict[tuple[str, str | None, int], Snapshot] = {}
        # Short-lived processes started so far (``short_lived_members``).
        self.short_lived = 0
        for label, member in self.members.items():
            member.start(reference=label in reference)

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

    def _answer(
        self,
        machine: MemberStateMachine,
        response: HeartbeatResponse,
        snapshot: Snapshot | None = None,
    ) -> None:
        """The member takes ``response``, computed on ``snapshot`` (by default
        what Redis holds now)."""
        # The arrival time of the answer, for the mutant that counts the member
        # lease from it (scripts/mutants.py); the real member never reads it.
        member_module.SIM_ARRIVAL_MS = self.now  # type: ignore[attr-defined]
        epoch = machine.epoch
        for reaction in machine.on_response(response):
            assert reaction.kind is not ReactionKind.REJECTED, response
            if reaction.kind is ReactionKind.LOST:
                COVERAGE.count("fenced")
        if machine.epoch > 0 and machine.epoch != epoch:
            origin = snapshot or self.redis.history[-1]
            self.epoch_origin[(machine.member_id, machine.incarnation, machine.epoch)] = origin

    def _origin(self, request: HeartbeatRequest) -> Snapshot | None:
        key = (request.member_id, request.incarnation, request.member_epoch)
        return self.epoch_origin.get(key)

    def _send(self, member: SimMember, fate: str, process: int = 0) -> None:
        machine = member.machine
        assert machine is not None
        request = machine.next_request(self.now, in_flight={s: 1 for s in machine.draining})
        if fate == "lose_request" or member.cut_off(self.now):
            machine.request_failed()
            return
        origin, principal = self._origin(request), member.principal
        self.network.hold(request, self.redis, origin, principal, copy=True)
        if fate == "delay":
            # The client times out and moves on; the request arrives later.
            self.network.hold(request, self.redis, origin, principal)
            machine.request_failed()
            return
        response = self._process(process).heartbeat(request, self.now, principal)
        if fate == "lose_response" or response is None:
            machine.request_failed()
            return
        self._answer(machine, response, self.redis.history[-1])

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
            self._churn_past_departed_reader(data, process)
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
                self._churn_past_departed_reader(data, process)
                self._deliver_reissued_reports(process)
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
        response = self._process(process).heartbeat(request, self.now, sim.principal)
        snapshot = self.redis.history[-1]
        self.now += to_client
        self.no_shard_held_twice()
        if response is None:
            machine.request_failed()
            return
        self._answer(machine, response, snapshot)

    def _deliver_reissued_reports(self, process: int, *, final: bool = False) -> None:
        """Deliver held reports whose epoch was issued by a write Redis lost.

        At once, at the sharpest moment: the sender's record holds the very
        epoch the report carries (a number issued twice, impossible when
        epochs never repeat), its version is no longer ahead of Redis', and
        taken for current it would release shards the sender holds now.  At
        the end of a stretch (``final``), every such report whose epoch and
        version the group has issued since, so that neither number gives it
        away as a witness.  Either way it must move nothing
        (``late_report_moves_nothing`` with ``lost``).
        """
        for held in list(self.network.delayed):
            group = self.redis.current[1]
            request = held.request
            if not held.from_lost_history(self.redis):
                continue
            if group.metadata_version < request.metadata_version:
                continue
            if final:
                due = group.last_issued_member_epoch >= request.member_epoch
            else:
                due = self._would_release(request, group)
            if due:
                self.network.delayed.remove(held)
                self.deliver_held(held, process)
                self.no_shard_held_twice()

    def _would_release(self, request: HeartbeatRequest, group: GroupMetadata) -> bool:
        """Taken for current, ``request`` would release shards its sender holds."""
        record = group.members.get(request.member_id)
        if record is None:
            return False
        if (record.member_epoch, record.incarnation) != (request.member_epoch, request.incarnation):
            return False
        held = set(group.shards_held_by(request.member_id))
        if any(s.shard_index not in held for s in request.owned_shards):
            return False  # it claims a shard it does not hold: it would be fenced
        return bool(held - reported(request))

    @precondition(lambda self: self._may_lose_writes())
    @rule(rounds=st.integers(3, 8), failover=st.booleans(), data=st.data())
    def redis_loses_reports_in_flight(
        self, rounds: int, failover: bool, data: st.DataObject
    ) -> None:
        """Redis loses a stretch of writes while reports sent during it are
        still on the wire, and the history that follows issues the same numbers
        again (or would, if epochs were counted on from Redis' counters).

        The review's schedule, with its choices drawn: members come and go in
        the lost stretch (so readers hold other shards there than later), and
        every report sent has a copy on the wire (``Network.copies``).  Some
        newcomers stop with the failure, the others run on unknown to Redis
        (they rejoin); members come and go again, in another order, in the
        history that follows, so the numbers of the lost stretch are issued
        again in other roles: a reader drains shards that a report carrying
        its current epoch never mentioned.  The copies are delivered at that
        moment, or at the end (``_deliver_reissued_reports``)."""
        newcomers = self._thin_out(data)
        if not self._may_lose_writes():
            return
        fork = len(self.redis.history)
        self._churn(newcomers, rounds, data, noisy=True)
        stopping = data.draw(st.sets(st.sampled_from(newcomers)), label="stop") if newcomers else ()
        for label in sorted(stopping):
            self.crash(label)
        self._lose_writes_from(fork, failover=failover)
        self._churn(newcomers, rounds, data, noisy=False)
        self._deliver_reissued_reports(0, final=True)

    def _thin_out(self, data: st.DataObject) -> list[str]:
        """Stop idle processes until fewer members than shards run (only then
        do joins and departures move shards), let the rest settle; the
        stopped ones, which may start again later."""
        idle = [label for label, sim in sorted(self.members.items()) if not sim.holding(self.now)]
        while sum(sim.alive for sim in self.members.values()) > SHARDS - 1 and idle:
            self.crash(idle.pop())
        self._stretch(data.draw(st.integers(6, 12), label="settle"), data, noisy=False)
        return [label for label, sim in sorted(self.members.items()) if not sim.alive]

    def _churn(self, pool: list[str], rounds: int, data: st.DataObject, *, noisy: bool) -> None:
        """A few cycles of members of ``pool`` starting or stopping, each
        followed by a stretch."""
        for _ in range(data.draw(st.integers(1, 3), label="cycles")):
            toggle = data.draw(st.sets(st.sampled_from(pool)), label="toggle") if pool else ()
            for label in sorted(toggle):
                if self.members[label].alive:
                    self.crash(label)
                else:
                    self.members[label].start()
            self._stretch(rounds, data, noisy=noisy)

    @rule(member=st.sampled_from(MEMBERS))
    def delayed_heartbeat(self, member: str) -> None:
        """A heartbeat stuck on the wire: the member gives up on it, it arrives later."""
        if self.members[member].alive:
            self._send(self.members[member], "delay")

    @precondition(lambda self: bool(self.network.delayed))
    @rule(data=st.data(), process=st.integers(0, len(PROCESSES) - 1))
    def deliver_late_duplicate(self, data: st.DataObject, process: int) -> None:
        index = data.draw(st.integers(0, len(self.network.delayed) - 1))
        self.deliver_held(self.network.delayed.pop(index), process)

    def deliver_held(self, held: Held, process: int) -> None:
        lost = held.from_lost_history(self.redis)
        if lost:
            COVERAGE.count("lost_history_deliveries")
        self.deliver_late_duplicate_of(held.request, process, lost=lost, principal=held.principal)

    def deliver_late_duplicate_of(
        self,
        request: HeartbeatRequest,
        process: int,
        *,
        lost: bool = False,
        principal: str | None = None,
    ) -> None:
        stored = self.redis.history[-1]
        # What the heartbeat will see once due timeouts are applied.
        base = state_of(tick(stored.group, self.now, CONFIG))
        # Nobody listens for the answer.
        self._process(process).heartbeat(request, self.now, principal)
        if self.redis.history[-1] is stored:
            # Nothing was written (a refused join, a fence): the timeouts the
            # base applied never happened, so the stored state is the base.
            base = stored.group
        self.late_report_moves_nothing(
            request, base, self.redis.current[1], lost=lost, principal=principal
        )

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
    @rule(member=st.sampled_from(MEMBERS), reference=st.booleans())
    def restart(self, member: str, reference: bool) -> None:
        """The process starts again: our client (a new incarnation) or a
        reference client (a new member id, known by its principal)."""
        if not self.members[member].alive:
            self.members[member].start(reference=reference)

    @rule(shards=st.integers(1, 6), ordered=st.booleans(), process=st.integers(0, 1))
    def reshard(self, shards: int, ordered: bool, process: int) -> None:
        """An operator scales the stream; provisioning is done by the next drain work."""
        self.reshards += 1
        rid = f"r{self.reshards}"
        coordinator = self._process(process)

        def op(group: GroupMetadata) -> Result[Any]:
            try:
                spec = ReshardingSpec(resharding_id=rid, target_shard_count=shards, ordered=ordered)
                return start_resharding(group, spec, self.now)
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

    @precondition(lambda self: any(sim.holding(self.now) for sim in self.members.values()))
    @rule(cut_off_for=st.integers(100, 1_500), rounds=st.integers(4, 12), data=st.data())
    def reader_cut_off(self, cut_off_for: int, rounds: int, data: st.DataObject) -> None:
        """A reader loses the network for a while, Redis losing nothing: it
        reads on under the lease it has while the others heartbeat around the
        moment that lease runs out and its shards move on."""
        readers = sorted(label for label, sim in self.members.items() if sim.holding(self.now))
        self.partition(data.draw(st.sampled_from(readers), label="reader"), cut_off_for)
        self._stretch(rounds, data, noisy=False)

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

    @precondition(
        lambda self: self._may_lose_writes() and not any(m.stalled for m in self.members.values())
    )
    @rule(failover=st.booleans(), rounds=st.integers(10, 20), data=st.data())
    def redis_forgets_grant_to_hung_reader(
        self, failover: bool, rounds: int, data: st.DataObject
    ) -> None:
        """Redis goes back to just before a reader was granted its shard, and
        the reader's handlers hang: it drains the shard Redis forgot, entries in
        flight, for longer than the round's lease wait.  A stopped process
        starts again whose join moves the shard's target to a third member,
        which asks for the shard as soon as the round closes: the round must
        stay open while the forgotten drain goes on.

        The reader must be known and live in the snapshot (so it is told to
        drain, not that it is unknown), and the join must move the target
        away from it (the restored target is almost always the reader itself,
        which is why random rollbacks never reached this).  Targets move only
        while members are fewer than shards, so idle processes stop first and
        the rest settle, taking their shards over: those are the grants.
        """
        # Moves happen only while members are fewer than shards: some
        # processes stop, and the rest take their shards over (the grants).
        self._thin_out(data)
        if not self._may_lose_writes():
            return
        history = self.redis.history
        for shard, holder in sorted(history[-1].group.owners.items()):
            sim = self._sim_of(holder)
            if sim is None or sim.machine is None or shard not in sim.machine.reading:
                continue
            grant = len(history) - 1
            while grant > 0 and history[grant - 1].group.owners.get(shard) == holder:
                grant -= 1
            if grant == 0 or not self._live_and_lasting_in(history[grant - 1].group, sim):
                continue
            found, joiner = self._join_moving_target(history[grant - 1].group, shard, holder)
            if not found:
                continue
            sim.stalled = True
            COVERAGE.count("forgotten_hung_drains")
            self._lose_writes_from(grant, failover=failover)
            if joiner is not None:
                self.members[joiner].start()
            self._stretch(rounds, data, noisy=False)
            return

    def _live_and_lasting_in(self, group: GroupMetadata, sim: SimMember) -> bool:
        """``sim`` runs, is reachable, and ``group`` knows it as live under its
        incarnation with more than a tick of lease left."""
        record = group.members.get(sim.member_id)
        return (
            sim.machine is not None
            and not sim.cut_off(self.now)
            and record is not None
            and record.live
            and record.incarnation == sim.machine.incarnation
            and record.last_heartbeat_ms + CONFIG.member_lease_ttl_ms > self.now + 100
        )

    def _join_moving_target(
        self, group: GroupMetadata, shard: int, holder: str
    ) -> tuple[bool, str | None]:
        """A stopped member (or none) whose join, with the running members
        ``group`` does not know (they rejoin once told they are unknown),
        moves ``shard``'s target away from ``holder``."""
        rejoining = {
            label
            for label, sim in self.members.items()
            if sim.alive and not sim.twin and label == sim.member_id and label not in group.members
        }
        stopped = sorted(label for label, sim in self.members.items() if not sim.alive)
        for joiner in [None, *stopped]:
            record = group.members.get(joiner) if joiner else None
            if record is not None and (record.live or group.shards_held_by(record.member_id)):
                continue  # another incarnation holds the id: its join is refused
            live = {*group.live_member_ids(), *rejoining, *([joiner] if joiner else [])}
            moved = assign(group.assignable_shards(), sorted(live), group.target).get(shard)
            if moved not in (None, holder):
                return True, joiner
        return False, None

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
        self.network.history_lost_from(len(self.redis.history))
        if failover:
            # Another server incarnation: any process notices at its first
            # document write (the stamp), witness or not.
            self.redis.server += 1
            COVERAGE.count("failovers")
        else:
            self.undetected_rollback = True
        COVERAGE.count("rollbacks")

    # -- identity faults ------------------------------------------------------------

    @precondition(lambda self: not any(sim.twin for sim in self.members.values()))
    @rule(member=st.sampled_from(MEMBERS))
    def start_twin(self, member: str) -> None:
        """A second process with the same (static) member id, another
        incarnation, deployed with the same credential."""
        original = self.members[member]
        twin = SimMember(
            original.member_id, label=f"{member}'", principal=original.principal, twin=True
        )
        twin.start()
        self.members[twin.label] = twin
        COVERAGE.count("twins")

    @precondition(lambda self: any(sim.twin for sim in self.members.values()))
    @rule()
    def stop_twin(self) -> None:
        for label in [k for k, sim in self.members.items() if sim.twin]:
            del self.members[label]  # a crash: whatever it held lingers in Redis

    @rule(member=st.sampled_from(MEMBERS), duplicate=st.booleans(), process=st.integers(0, 1))
    def graceful_stop(self, member: str, duplicate: bool, process: int) -> None:
        """Drain, leave (-1), exit; a copy of the leave may arrive much later,
        after a restart (a new incarnation) took the member id again."""
        sim = self.members[member]
        if sim.machine is None or sim.stalled:
            return
        self._leave(sim, process, duplicate=duplicate)
        COVERAGE.count("graceful_stops")

    def _leave(self, sim: SimMember, process: int, *, duplicate: bool = False) -> None:
        machine = sim.machine
        assert machine is not None
        machine.stop()
        for shard in sorted(machine.draining):
            machine.drained(shard)
        request = machine.leave_request(self.now)
        if duplicate:
            self.network.hold(request, self.redis, None, sim.principal)
        if not sim.cut_off(self.now):  # else the leave is lost: its shards wait for expiry
            self._process(process).heartbeat(request, self.now, sim.principal)
        sim.machine = None

    @rule(
        count=st.integers(1, 16),
        crashed=st.sets(st.integers(0, 15)),
        reference=st.booleans(),
        process=st.integers(0, 1),
    )
    def short_lived_members(
        self, count: int, crashed: set[int], reference: bool, process: int
    ) -> None:
        """A deploy gone wrong: processes start, join and stop again one after
        another, each under a member id of its own (our client draws one per
        start), some leaving, some crashing.

        Departed records stay for the retention period, so the group soon
        holds as many as it keeps (``core.limits``; crashed ones count as live
        until their lease ends, so joins meet the member limit too).  From
        then on a join drops the oldest departed records, and one of a member
        that may still read (fenced inside its lease, draining after a
        rollback) must never be among them.
        """
        self._short_lived(count, crashed, reference, process)

    def _short_lived(self, count: int, crashed: set[int], reference: bool, process: int) -> None:
        for i in range(count):
            self.short_lived += 1
            self.now += 1
            label = f"x{self.short_lived}"
            sim = SimMember(label)
            sim.start(reference=reference)
            self.members[label] = sim
            self._send(sim, "ok", process)
            self.no_shard_held_twice()
            if i in crashed:
                sim.machine = None
            else:
                self._leave(sim, process)
            del self.members[label]

    def _churn_past_departed_reader(self, data: st.DataObject, process: int) -> None:
        """Sometimes, when a member is departed in Redis (just fenced) while
        its process still reads (it has not heard yet, its lease runs on): a
        wave of short-lived processes takes the group past the departed
        records it keeps.  No join may drop that member's record (the shards
        it holds would be granted at once), so past the cap they are refused.
        Drawn only at that moment, which random rules between steps never hit."""
        if not self._departed_readers() or not data.draw(st.booleans(), label="wave"):
            return
        group = self.redis.current[1]
        cap = RECORDS_PER_MEMBER_SLOT * CONFIG.max_members_per_group
        COVERAGE.count("departed_readers_at_cap")
        reference = data.draw(st.booleans(), label="reference")
        self._short_lived(max(1, cap - len(group.members) + 2), set(), reference, process)

    def _departed_readers(self) -> list[str]:
        """Members departed in Redis that hold shards their process still holds."""
        group = self.redis.current[1]
        found = []
        for member_id, record in group.members.items():
            sim = self._sim_of(member_id)
            held = set(group.shards_held_by(member_id))
            if record.live or sim is None or not held & sim.holding(self.now):
                continue
            found.append(member_id)
        return found

    @rule(
        member=st.sampled_from(MEMBERS),
        incarnation=st.sampled_from([None, "forged"]),
        leave=st.booleans(),
        insider=st.booleans(),
        process=st.integers(0, 1),
        sharp=st.booleans(),
    )
    def forged_leave(
        self,
        member: str,
        incarnation: str | None,
        leave: bool,
        insider: bool,
        process: int,
        sharp: bool,
    ) -> None:
        """Anyone who reaches the member API sends a leave, or a report that
        gives every shard up, for someone else's member id: with its current
        epoch (epochs are shown to anyone with READ), under a member
        credential of its own (``insider``: another member's; else an
        intruder's).  ``sharp``: aimed at a reference client that holds
        shards, when one does (nothing but its principal tells its requests
        from the forger's)."""
        sims = [self.members[member]]
        if sharp:
            sims = [s for s in self.members.values() if s.reference and s.holding(self.now)]
            sims = sims or [self.members[member]]
        victim = sims[MEMBERS.index(member) % len(sims)]
        target = victim.member_id
        record = self.redis.current[1].members.get(target)
        epoch = -1 if leave or record is None else record.member_epoch
        request = HeartbeatRequest(
            protocol_version=1,
            request_id="forged",
            member_id=target,
            member_epoch=epoch,
            metadata_version=self.redis.current[1].metadata_version,
            runtime_consumer_capacity=RuntimeConsumerCapacity(
                runtime_max_concurrency=1, available_concurrency=1
            ),
            incarnation=incarnation,
        )
        # Never the victim's own credential: a leave signed with it is the
        # member's own leave (stealing a credential is outside the model).
        others = sorted(
            {sim.principal for sim in self.members.values()} - {f"p-{member}", victim.principal}
        )
        principal = others[0] if insider and others else "intruder"
        COVERAGE.count("forged_leaves" if leave else "forged_reports")
        self.deliver_late_duplicate_of(request, process, principal=principal)

    def _sim_of(self, member_id: str) -> SimMember | None:
        """The process (not a twin) whose current start has ``member_id``."""
        return next(
            (s for s in self.members.values() if s.member_id == member_id and not s.twin), None
        )

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
        self,
        request: HeartbeatRequest,
        base: GroupMetadata,
        after: GroupMetadata,
        *,
        lost: bool = False,
        principal: str | None = None,
    ) -> None:
        """Checked on every late delivery, whatever its epoch.

        A shard leaves its holder only on the holder's own current-epoch report
        that no longer lists it; a shard is granted only to the sender, only as
        its target, and only on a join or a current-epoch report.
        """
        COVERAGE.count("late_deliveries_checked")
        sender = request.member_id
        member = base.members.get(sender)
        # Whether the process the record belongs to sent it, as the simulation
        # knows it: our clients by the incarnation they drew, a reference
        # client (no incarnation, a member id per start) by its credential.
        own = member is not None and (
            member.incarnation == request.incarnation
            if request.incarnation is not None
            else principal is not None and principal == reference_principal(sender)
        )
        # A report from a history Redis lost is never current, whatever its
        # numbers say (the simulation knows where its epoch was issued).
        current = (
            not lost
            and own
            and member is not None
            and member.live
            and request.member_epoch == member.member_epoch
        )
        # A leave from the process itself is true whenever it arrives: that
        # start of the process drained and reads nothing, ever again (a process
        # that rejoins draws a new incarnation, or a new member id, first).
        own_leave = request.member_epoch < 0 and own
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
