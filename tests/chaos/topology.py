"""The system under test, all real processes on loopback: a Redis primary
with an asynchronous replica, coordinator processes behind a load-balancing
proxy, ``streamkit run`` consumers and a publisher process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio
from consumer.support import REPO, AppProcess
from helpers import sigterm_then_kill

from streamkit.testing import HOST, RedisServer
from streamkit.testing.coordinator import CoordinatorProcess

from .proxy import ChaosProxy

#: Timings of the coordinators under test (short, so a soak sees many leases).
HEARTBEAT_MS = 250
MEMBER_LEASE_MS = 2_000
REBALANCE_TIMEOUT_MS = 4_000
_REDIS_ARGS = ("--enable-debug-command", "yes", "--repl-diskless-sync-delay", "0")


def direct(server: RedisServer) -> redis.asyncio.Redis:
    """A client that bypasses the proxy (the operator's and the chaos' own line)."""
    return redis.asyncio.Redis(host=HOST, port=server.port, socket_timeout=10)


class Topology:
    def __init__(
        self,
        workdir: Path,
        *,
        prefix: str,
        group: str,
        shards: int,
        consumer_env: dict[str, str],
        publisher_env: dict[str, str],
    ) -> None:
        self.workdir = workdir
        self.prefix = prefix
        self.group = group
        self.shards = shards
        self.consumer_env = consumer_env
        self.publisher_env = publisher_env
        self.primary: RedisServer | None = None
        self.replica: RedisServer | None = None
        self.link: ChaosProxy | None = None
        self.front = ChaosProxy([])  # the Redis endpoint every client uses
        self.lb = ChaosProxy([])  # the coordinators' load balancer
        self.coordinators: list[CoordinatorProcess] = []
        self.consumers: list[AppProcess] = []
        self.publisher: subprocess.Popen[bytes] | None = None
        self.died_ns: dict[int, int] = {}
        self.record_files: list[Path] = []
        self._starts = 0
        #: Cluster mode (ClusterTopology): clients and coordinators use RedisCluster.
        self.cluster = False
        self.replica_task: asyncio.Task[None] | None = None

    # -- Redis -------------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.front.port}/0"

    async def start_redis(self) -> None:
        await self.front.start()
        await self.lb.start()
        self.primary = await asyncio.to_thread(RedisServer(extra_args=_REDIS_ARGS).start)
        self.front.switch([self.primary.port], cut=False)
        await self.add_replica()

    async def add_replica(self) -> None:
        """A fresh replica of the current primary, through a link we control."""
        assert self.primary is not None
        link = ChaosProxy([self.primary.port])
        await link.start()
        replica = await asyncio.to_thread(
            RedisServer(extra_args=(*_REDIS_ARGS, "--replicaof", HOST, str(link.port))).start
        )
        async with direct(replica) as conn:
            for _ in range(400):
                info = await conn.info("replication")
                if info.get("master_link_status") == "up":
                    break
                await asyncio.sleep(0.05)
        self.link, self.replica = link, replica

    async def restart_primary(self) -> None:
        """The primary's process restarts on its port with nothing persisted
        (a fresh server: a promoted replica must not come back as a replica)."""
        assert self.primary is not None
        port = self.primary.port
        await asyncio.to_thread(self.primary.stop)
        self.primary = await asyncio.to_thread(RedisServer(port=port, extra_args=_REDIS_ARGS).start)

    async def replica_in_sync(self, within: float = 5.0) -> bool:
        assert self.primary is not None
        if self.replica is None:
            return False
        async with direct(self.primary) as conn:
            acked = await conn.execute_command("WAIT", 1, int(within * 1000))
        return int(acked) >= 1

    # -- coordinators --------------------------------------------------------------

    async def start_coordinator(self) -> CoordinatorProcess:
        proc = CoordinatorProcess(
            self.redis_url,
            cluster=self.cluster,
            heartbeat_interval_ms=HEARTBEAT_MS,
            member_lease_ttl_ms=MEMBER_LEASE_MS,
            rebalance_timeout_ms=REBALANCE_TIMEOUT_MS,
            tick_interval_ms=100,
        )
        await asyncio.to_thread(proc.start)
        self.coordinators.append(proc)
        self.lb.switch([c.port for c in self.coordinators], cut=False)
        return proc

    def forget_coordinator(self, proc: CoordinatorProcess) -> None:
        self.coordinators.remove(proc)
        self.lb.switch([c.port for c in self.coordinators], cut=False)

    async def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        proc = self.coordinators[0]
        async with httpx.AsyncClient(base_url=self.lb.url, auth=proc.admin_auth, timeout=5) as http:
            return await http.request(method, path, **kwargs)

    async def create_group(self) -> None:
        """Create the group, retrying through the faults in flight.

        An attempt whose answer was lost (a dropped connection, a timeout, a
        5xx) may still have created the group, so a later 409 is that
        attempt's success, not a conflict, provided the group has the shard
        count asked for. A 409 on the first answer is a real failure."""
        last = "no answer"
        outcome_unknown = False
        path = f"/coord/v1/streams/{self.prefix}/groups/{self.group}"
        body = {"initialShardCount": self.shards, "requestedBy": "chaos", "reason": "soak"}
        for _ in range(100):
            try:
                response = await self.admin("POST", path, json=body)
            except httpx.HTTPError as exc:
                last = repr(exc)
                outcome_unknown = True
            else:
                if response.status_code in (200, 201):
                    return
                last = f"{response.status_code} {response.text}"
                if response.status_code == 409 and outcome_unknown:
                    if await self._group_has_asked_shards():
                        return
                elif response.status_code >= 500:
                    outcome_unknown = True
            await asyncio.sleep(0.1)
        raise AssertionError(f"could not create the group: {last}")

    async def _group_has_asked_shards(self) -> bool:
        path = f"/coord/v1/monitoring/streams/{self.prefix}/groups/{self.group}"
        with contextlib.suppress(httpx.HTTPError):
            response = await self.admin("GET", path)
            if response.status_code == 200:
                return bool(response.json()["shardCount"] == self.shards)
        return False

    # -- consumers and publisher ---------------------------------------------------------

    def start_consumer(self) -> AppProcess:
        n = self._starts
        self._starts += 1
        record = self.workdir / f"consumer-{n}.rec"
        self.record_files.append(record)
        env = dict(self.consumer_env, SKC_RECORD=str(record), STREAMKIT_MEMBER_ID_BASE=f"c{n}")
        proc = AppProcess("tests.chaos.app:app", env, self.workdir / f"consumer-{n}.log")
        self.consumers.append(proc.start())
        return proc

    def kill_consumer(self, proc: AppProcess) -> None:
        proc.kill()
        assert proc.died_ns is not None
        self.died_ns[proc.pid] = proc.died_ns
        self.consumers.remove(proc)

    async def stop_consumer(self, proc: AppProcess, within: float = 15.0) -> None:
        """Graceful stop (SIGTERM); SIGKILL if it takes longer than ``within``."""
        self.consumers.remove(proc)
        try:
            await proc.terminate(within)
        except AssertionError:
            proc.kill()
        self.died_ns[proc.pid] = proc.died_ns or time.monotonic_ns()

    def start_publisher(self) -> None:
        env = dict(os.environ)
        env.update(self.publisher_env)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.workdir / "publisher.log", "ab") as log:
            self.publisher = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.publisher"],
                env=env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def stop_publisher(self) -> None:
        proc, self.publisher = self.publisher, None
        if proc is None:
            return
        await sigterm_then_kill(proc)

    # -- teardown --------------------------------------------------------------------------

    async def close(self) -> None:
        if self.replica_task is not None:
            self.replica_task.cancel()
            with contextlib.suppress(BaseException):
                await self.replica_task
        if self.publisher is not None:
            self.publisher.kill()
            self.publisher.wait(5)
        for proc in list(self.consumers):
            proc.cleanup()
        for coordinator in list(self.coordinators):
            await asyncio.to_thread(coordinator.kill)
            await asyncio.to_thread(coordinator.cleanup)
        for proxy in (self.front, self.lb, self.link):
            if proxy is not None:
                await proxy.close()
        for server in (self.primary, self.replica):
            if server is not None:
                await asyncio.to_thread(server.stop)
