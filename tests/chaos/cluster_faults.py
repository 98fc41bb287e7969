"""The Redis Cluster faults of the soak (``--cluster``), beside the consumer
and coordinator faults of ``faults.py``.

* ``cluster-kill``: SIGKILL of a primary; the cluster promotes its replica,
  the killed node comes back (same ``nodes.conf``) as the new primary's replica.
* ``cluster-failover``: ``CLUSTER FAILOVER`` (graceful) on a replica.
* ``cluster-migrate-shard`` / ``cluster-migrate-meta``: the slot of a shard
  stream, or of the group's metadata, moves to another primary
  (``SETSLOT IMPORTING/MIGRATING``, ``MIGRATE``, ``SETSLOT NODE``) under load.
* ``cluster-pause``: SIGSTOP of a node for longer than ``cluster-node-timeout``.
* ``redis-oom``: one primary at ``maxmemory`` for a few seconds (oom.py),
  half the time the one holding the group's metadata.

Entries a promoted replica never received are counted as dropped by Redis,
as after the standalone failover.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field

from streamkit.routing import redis_cluster_slot
from streamkit.testing import HOST, RedisServer

from .checks import DataLoss
from .cluster import NODE_TIMEOUT_MS, ClusterTopology
from .faults import Chaos
from .topology import direct

CLUSTER_KINDS = (
    "consumer-kill",
    "consumer-pause",
    "coordinator-kill",
    "coordinator-roll",
    "coordinator-delay",
    "coordinator-drop",
    "scale",
    "cluster-kill",
    "cluster-failover",
    "cluster-migrate-shard",
    "cluster-migrate-meta",
    "cluster-pause",
    "redis-oom",
)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _call(node: RedisServer, *args: object) -> object:
    with node.client(socket_timeout=10) as conn:
        return conn.execute_command(*args)


def _slot_owner(top: ClusterTopology, slot: int) -> RedisServer:
    # Ask every primary which slot it owns itself (its own view is authoritative).
    for node in top.redis_cluster.current_primaries():
        mine = _text(_call(node, "CLUSTER", "MYID"))
        for start, end, primary, *_ in _call(node, "CLUSTER", "SLOTS"):  # type: ignore[attr-defined]
            if start <= slot <= end and _text(primary[2]) == mine:
                return node
    raise AssertionError(f"no primary owns slot {slot}")


def _migrate_slot(top: ClusterTopology, slot: int, pick: float) -> str:
    """Move one slot to another primary, keys and all, while clients use it."""
    source = _slot_owner(top, slot)
    others = [n for n in top.redis_cluster.current_primaries() if n.port != source.port]
    target = others[int(pick * len(others)) % len(others)]
    src_id = _text(_call(source, "CLUSTER", "MYID"))
    dst_id = _text(_call(target, "CLUSTER", "MYID"))
    _call(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    _call(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    moved = 0
    while True:
        keys = _call(source, "CLUSTER", "GETKEYSINSLOT", slot, 100)
        if not keys:
            break
        _call(source, "MIGRATE", HOST, target.port, "", 0, 10_000, "REPLACE", "KEYS", *keys)  # type: ignore[misc]
        moved += len(keys)  # type: ignore[arg-type]
    # The target first, so the slot is never owned by nobody (redis-cli's order).
    _call(target, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    _call(source, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    for node in top.redis_cluster.current_primaries():
        if node.port not in (source.port, target.port):
            _call(node, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    return f"slot {slot} ({moved} keys) {source.port} -> {target.port}"


@dataclass
class ClusterChaos(Chaos):
    #: Ports of SIGSTOPped nodes: nobody of ours waits on them.
    paused: set[int] = field(default_factory=set)

    @property
    def ctop(self) -> ClusterTopology:
        assert isinstance(self.top, ClusterTopology)
        return self.top

    async def _await_healthy(self, within: float = 30.0) -> None:
        """Every running node says ``cluster_state:ok`` and every slot is served."""
        cluster = self.ctop.redis_cluster
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                infos = await asyncio.to_thread(
                    lambda: [cluster.cluster_info(n) for n in self._live()]
                )
            except Exception:  # a node still loading or just restarted
                infos = []
            if infos and all(
                i.get("cluster_state") == "ok" and i.get("cluster_slots_ok") == "16384"
                for i in infos
            ):
                return
            await asyncio.sleep(0.1)
        raise AssertionError("the cluster did not heal")

    def _live(self) -> list[RedisServer]:
        return [
            n for n in self.ctop.redis_cluster.nodes if n.is_running() and n.port not in self.paused
        ]

    async def _count_losses(self, kind: str) -> None:
        """Seqs published so far that no shard stream holds any more."""
        client = self.ctop.client(exclude=self.paused)
        try:
            present = await self._present(client)
        finally:
            await client.aclose()
        t = time.monotonic_ns()
        gone = {s for s in self._published_between(0, t) if s not in present}
        self.losses.append(DataLoss(kind, t, gone))
        since = self.losses[-2].t_ns if len(self.losses) > 1 else 0
        fresh = len(gone & self._published_between(since, t))
        self.note(f"{kind}: {fresh} published entries were not replicated")

    def _replica_of(self, primary: RedisServer) -> RedisServer:
        """The replica of ``primary`` (one each), the node a failover promotes."""
        me = _text(_call(primary, "CLUSTER", "MYID"))
        lines = _call(primary, "CLUSTER", "REPLICAS", me)
        port = int(_text(lines[0]).split()[1].split("@")[0].rsplit(":", 1)[1])  # type: ignore[index]
        return self.ctop.node_by_port(port)

    async def _wait_role(self, node: RedisServer, role: str, within: float = 20.0) -> None:
        cluster = self.ctop.redis_cluster
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                if await asyncio.to_thread(cluster.role, node) == role:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.1)
        raise AssertionError(f"node {node.port} did not become {role}")

    async def _cluster_kill(self) -> None:
        async with self.redis_lock:
            cluster = self.ctop.redis_cluster
            victim = self.rng.choice(await asyncio.to_thread(cluster.current_primaries))
            heir = await asyncio.to_thread(self._replica_of, victim)
            await asyncio.to_thread(victim.kill)
            self.note(f"SIGKILL primary {victim.port}")
            # cluster_state stays "ok" until the others notice: wait for the promotion.
            await self._wait_role(heir, "master")
            await self._await_healthy()
            await self._count_losses("cluster-kill")
            await asyncio.to_thread(victim.restart)
            await self._wait_role(victim, "slave")
            await self._await_healthy()
            self.note(f"primary {victim.port} back as a replica")

    async def _cluster_failover(self) -> None:
        async with self.redis_lock:
            cluster = self.ctop.redis_cluster
            replicas = [
                n
                for n in cluster.nodes
                if n.is_running() and await asyncio.to_thread(cluster.role, n) == "slave"
            ]
            chosen = self.rng.choice(replicas)
            await asyncio.to_thread(_call, chosen, "CLUSTER", "FAILOVER")
            await self._wait_role(chosen, "master")
            await self._await_healthy()
            self.note(f"CLUSTER FAILOVER to {chosen.port}")

    async def _cluster_migrate_shard(self) -> None:
        async with self.redis_lock:
            shard = self.rng.randrange(self.top.shards)
            slot = redis_cluster_slot(f"{self.top.prefix}:{shard}")
            done = await asyncio.to_thread(_migrate_slot, self.ctop, slot, self.rng.random())
            self.note(f"migrated shard {shard}: {done}")

    async def _cluster_migrate_meta(self) -> None:
        async with self.redis_lock:
            slot = redis_cluster_slot(f"{{{self.top.prefix}:{self.top.group}}}")
            done = await asyncio.to_thread(_migrate_slot, self.ctop, slot, self.rng.random())
            self.note(f"migrated the group metadata: {done}")

    async def _cluster_pause(self) -> None:
        async with self.redis_lock:
            cluster = self.ctop.redis_cluster
            victim = self.rng.choice([n for n in cluster.nodes if n.is_running()])
            was = await asyncio.to_thread(cluster.role, victim)
            heir = await asyncio.to_thread(self._replica_of, victim) if was == "master" else None
            pause = NODE_TIMEOUT_MS / 1000 + self.rng.uniform(1.0, 2.5)
            self.paused.add(victim.port)
            victim._signal(signal.SIGSTOP)
            self.note(f"SIGSTOP {was} {victim.port} for {pause:.1f}s")
            await asyncio.sleep(pause)
            if heir is not None:
                await self._wait_role(heir, "master")
                await self._await_healthy()
                await self._count_losses("cluster-pause")
            victim._signal(signal.SIGCONT)
            self.paused.discard(victim.port)
            await self._await_healthy()

    async def _redis_oom(self) -> None:
        async with self.redis_lock:
            cluster = self.ctop.redis_cluster
            primaries = await asyncio.to_thread(cluster.current_primaries)
            meta_slot = redis_cluster_slot(f"{{{self.top.prefix}:{self.top.group}}}")
            meta_owner = await asyncio.to_thread(_slot_owner, self.ctop, meta_slot)
            # Half the time the primary holding the group's metadata (the
            # coordinator's writes are refused too), else another one.
            others = [n for n in primaries if n.port != meta_owner.port]
            here = self.rng.random() < 0.5 or not others
            victim = meta_owner if here else self.rng.choice(others)
            where = "with" if here else "without"
            self.note(f"OOM on primary {victim.port} ({where} the group's metadata)")
            async with direct(victim) as conn:
                await self._squeeze(conn, victim.port, metadata_here=here)
