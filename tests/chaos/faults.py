"""The faults of the soak, each bounded in time, and their seeded schedule."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from dataclasses import dataclass, field

import httpx

from .checks import DataLoss, FaultSpan
from .oom import OomLog, probe_heartbeat, squeeze
from .topology import MEMBER_LEASE_MS, Topology, direct

KINDS = (
    "consumer-kill",
    "consumer-pause",
    "coordinator-kill",
    "coordinator-roll",
    "redis-failover",
    "redis-restart",
    "redis-slow",
    "redis-oom",
    "coordinator-delay",
    "coordinator-drop",
    "scale",
)
MIN_CONSUMERS = 2
MAX_CONSUMERS = 4


def schedule(
    rng: random.Random,
    start: float,
    end: float,
    *,
    repeat: bool = True,
    kinds: tuple[str, ...] = KINDS,
) -> list[tuple[float, str]]:
    """Every kind once in a random order, 2-4.5 s apart (faults overlap:
    most last longer), then (``repeat``) random kinds 3-8 s apart until ``end``."""
    order = list(kinds)
    rng.shuffle(order)
    plan: list[tuple[float, str]] = []
    t = start
    for kind in order:
        plan.append((round(t, 2), kind))
        t += rng.uniform(2.0, 4.5)
    while repeat and t < end:
        plan.append((round(t, 2), rng.choice(kinds)))
        t += rng.uniform(3.0, 8.0)
    return plan


@dataclass
class Chaos:
    top: Topology
    rng: random.Random
    spans: list[FaultSpan] = field(default_factory=list)
    losses: list[DataLoss] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Faults that could not be injected (no replica in sync for a failover).
    skipped: list[str] = field(default_factory=list)
    consumers_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    coordinators_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    redis_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: What the redis-oom faults did (oom.py).
    oom: OomLog = field(default_factory=OomLog)

    def note(self, text: str) -> None:
        self.notes.append(f"{time.monotonic():.2f} {text}")

    async def run(self, kind: str) -> None:
        fault = getattr(self, "_" + kind.replace("-", "_"))
        start = time.monotonic_ns()
        await fault()
        self.spans.append(FaultSpan(kind, start, time.monotonic_ns()))

    # -- consumers --------------------------------------------------------------------

    async def _consumer_kill(self) -> None:
        async with self.consumers_lock:
            victim = self.rng.choice(self.top.consumers)
            self.top.kill_consumer(victim)
            self.note(f"SIGKILL consumer pid {victim.pid}")
            await asyncio.sleep(self.rng.uniform(0.3, 1.5))
            self.top.start_consumer()

    async def _consumer_pause(self) -> None:
        async with self.consumers_lock:
            victim = self.rng.choice(self.top.consumers)
            # Longer than the member lease: the others take its shards, and it
            # must not read them again when it wakes.
            pause = MEMBER_LEASE_MS / 1000 + self.rng.uniform(0.5, 1.5)
            victim.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
            self.note(f"SIGSTOP consumer pid {victim.pid} for {pause:.1f}s")
            await asyncio.sleep(pause)
            victim.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]

    async def _scale(self) -> None:
        async with self.consumers_lock:
            count = len(self.top.consumers)
            out = count < MAX_CONSUMERS and (count <= MIN_CONSUMERS or self.rng.random() < 0.5)
            if out:
                self.top.start_consumer()
                self.note("scale out: one more consumer")
            else:
                victim = self.rng.choice(self.top.consumers)
                self.note(f"scale in: SIGTERM consumer pid {victim.pid}")
                await self.top.stop_consumer(victim)

    # -- coordinators -----------------------------------------------------------------

    async def _coordinator_kill(self) -> None:
        async with self.coordinators_lock:
            victim = self.rng.choice(self.top.coordinators)
            self.top.forget_coordinator(victim)
            self.top.lb.cut()  # its connections die with it
            await asyncio.to_thread(victim.kill)
            self.note(f"SIGKILL coordinator {victim.port}")
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))
            if not self.top.coordinators:
                await self.top.start_coordinator()
            await asyncio.to_thread(victim.cleanup)

    async def _coordinator_roll(self) -> None:
        """Rolling restart: 1 -> 2 -> 1 processes, the old one stopped gracefully."""
        async with self.coordinators_lock:
            old = list(self.top.coordinators)
            await self.top.start_coordinator()
            await asyncio.sleep(self.rng.uniform(0.5, 1.5))
            for proc in old:
                self.top.forget_coordinator(proc)
                await asyncio.to_thread(proc.stop)
                await asyncio.to_thread(proc.cleanup)
            self.note("rolled the coordinators")

    async def _coordinator_delay(self) -> None:
        self.top.lb.delay_s = self.rng.uniform(0.2, 0.6)
        self.note(f"coordinator answers delayed {self.top.lb.delay_s:.2f}s")
        await asyncio.sleep(self.rng.uniform(2.0, 3.5))
        self.top.lb.delay_s = 0.0

    async def _coordinator_drop(self) -> None:
        self.top.lb.drop_p = self.rng.uniform(0.2, 0.5)
        self.note(f"coordinator answers dropped with p={self.top.lb.drop_p:.2f}")
        await asyncio.sleep(self.rng.uniform(2.0, 3.5))
        self.top.lb.drop_p = 0.0

    # -- Redis ------------------------------------------------------------------------

    async def _redis_slow(self) -> None:
        async with self.redis_lock:
            assert self.top.primary is not None
            async with direct(self.top.primary) as conn:
                for _ in range(self.rng.randint(2, 3)):
                    pause = self.rng.uniform(0.2, 0.7)
                    await conn.execute_command("DEBUG", "SLEEP", f"{pause:.2f}")
                    await asyncio.sleep(self.rng.uniform(0.2, 0.6))
            self.note("DEBUG SLEEP on the primary")

    async def _redis_oom(self) -> None:
        async with self.redis_lock:
            assert self.top.primary is not None
            async with direct(self.top.primary) as conn:
                await self._squeeze(conn, self.top.primary.port, metadata_here=True)

    async def _squeeze(self, conn: object, port: int, *, metadata_here: bool) -> None:
        """``port`` at maxmemory for 2-4 s; the coordinator is probed when
        the group's metadata lives there (its writes are then refused)."""
        await self._publisher_publishing()
        await squeeze(
            conn,  # type: ignore[arg-type]
            port,
            self.rng.uniform(2.0, 4.0),
            self.oom,
            self.note,
            self._probe_coordinator if metadata_here else None,
        )

    async def _publisher_publishing(self, within: float = 15.0) -> None:
        """Until the publisher appends again (a restart's recovery may still
        be starting it), so a full Redis meets the load it is about."""
        path = self.top.workdir / "publisher.rec"
        size = path.stat().st_size if path.exists() else 0
        for _ in range(int(within / 0.1)):
            if path.exists() and path.stat().st_size > size:
                return
            await asyncio.sleep(0.1)
        self.note("redis-oom: the publisher did not append for 15 s; squeezing anyway")

    async def _probe_coordinator(self) -> str:
        if not self.top.coordinators:
            return "no coordinator running"
        auth = self.top.coordinators[0].member_auth
        return await probe_heartbeat(self.top.lb.url, auth, self.top.prefix, self.top.group)

    async def _present(self, conn: object) -> set[int]:
        """Every seq the shard streams hold on one server."""
        present: set[int] = set()
        for shard in range(self.top.shards):
            entries = await conn.xrange(f"{self.top.prefix}:{shard}")  # type: ignore[attr-defined]
            present.update(int(fields[b"seq"]) for _, fields in entries)
        return present

    async def _redis_failover(self) -> None:
        """The replica lags, the primary dies, the replica is promoted: the
        writes it never received (entries, acks, coordinator metadata) are gone."""
        async with self.consumers_lock, self.redis_lock:
            top = self.top
            if top.replica_task is not None:
                await top.replica_task
                top.replica_task = None
            if not await top.replica_in_sync():
                self.note("failover skipped: no replica in sync")
                self.skipped.append("redis-failover")
                return
            assert top.link is not None and top.replica is not None and top.primary is not None
            top.link.hold()
            self.note("replication held")
            if len(top.consumers) < MAX_CONSUMERS and self.rng.random() < 0.7:
                top.start_consumer()  # a join the promoted replica will never have seen
                self.note("scale out during the lag")
            await asyncio.sleep(self.rng.uniform(1.5, 3.0))
            old = top.primary
            top.front.switch([], cut=True)
            await asyncio.to_thread(old.kill)
            await top.link.close()
            promoted = top.replica
            async with direct(promoted) as conn:
                await conn.execute_command("REPLICAOF", "NO", "ONE")
                present = await self._present(conn)
            t = time.monotonic_ns()
            gone = {s for s in self._published_between(0, t) if s not in present}
            self.losses.append(DataLoss("failover", t, gone))
            since = self.losses[-2].t_ns if len(self.losses) > 1 else 0
            fresh = len(gone & self._published_between(since, t))
            top.primary, top.replica, top.link = promoted, None, None
            top.front.switch([promoted.port], cut=True)
            self.note(f"promoted the replica; {fresh} published entries were not replicated")
            await asyncio.to_thread(old.stop)
            top.replica_task = asyncio.ensure_future(top.add_replica())

    def _published_between(self, since_ns: int, t_ns: int) -> set[int]:
        path = self.top.workdir / "publisher.rec"
        out: set[int] = set()
        for line in path.read_text().splitlines():
            p = line.split()
            if len(p) == 6 and p[0] == "P" and since_ns < int(p[5]) <= t_ns:
                out.add(int(p[1]))
        return out

    async def _redis_restart(self) -> None:
        """Redis comes back empty: every group fails closed until the operator
        recreates it and restarts its consumers and producers (operations.md,
        "Metadata key lost, corrupt or rolled back", step 4)."""
        async with self.consumers_lock, self.coordinators_lock, self.redis_lock:
            top = self.top
            if top.replica_task is not None:
                await top.replica_task
                top.replica_task = None
            assert top.primary is not None
            async with direct(top.primary) as conn:
                # Freeze writes so the snapshot is exactly what the restart loses.
                await conn.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
                present = await self._present(conn)
            t = time.monotonic_ns()
            self.losses.append(DataLoss("restart", t, present))
            top.front.cut()
            await top.restart_primary()
            self.note("Redis restarted empty")
            await self._expect_fail_closed()
            # The operator's recovery: recreate the group, restart its clients.
            await top.stop_publisher()
            count = len(top.consumers)
            await asyncio.gather(*(top.stop_consumer(p, within=3.0) for p in list(top.consumers)))
            await top.create_group()
            for _ in range(count):
                top.start_consumer()
            top.start_publisher()
            self.note("group recreated, consumers and publisher restarted")

    async def _expect_fail_closed(self, within: float = 15.0) -> None:
        """The coordinator must answer 404 for the group whose metadata is gone
        (it never rebuilds it); retried, as the load balancer may be dropping."""
        top = self.top
        path = f"/coord/v1/monitoring/streams/{top.prefix}/groups/{top.group}/members"
        last = "no answer"
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                response = await top.admin("GET", path)
            except httpx.HTTPError as exc:
                last = repr(exc)
            else:
                if response.status_code == 404:
                    self.note("group after the restart: HTTP 404 (fails closed)")
                    return
                last = f"{response.status_code} {response.text}"
                if response.status_code != 503:
                    break
            await asyncio.sleep(0.2)
        raise AssertionError(f"the group did not fail closed after Redis lost it: {last}")
