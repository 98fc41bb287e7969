"""Two releases on one Redis under load: the processes, the roll, the verdict.

A :class:`Fleet` runs, on loopback, one real redis-server, coordinator
processes behind a round-robin proxy (the load balancer), consumer processes
(the chaos soak's recording app, ``tests/chaos/app.py``) and the soak's
publisher, each process from either release (a :class:`Side`).  The verdict
is the soak's (``tests/chaos/checks.py``), from the records alone: every
published entry handled, no shard read by two members at once, no read
without a lease, per-key order kept.

``roll()`` replaces the processes one at a time, as a deployment does: a
coordinator is replaced by starting the new one, adding it to the balancer,
then taking the old one out and stopping it (SIGTERM); a consumer by starting
the new one, then stopping the old one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from chaos import checks
from chaos.proxy import ChaosProxy
from helpers import AppProcess, sigterm_then_kill

from streamkit.testing import HOST, RedisServer
from streamkit.testing.coordinator import (
    TEST_ADMIN_PASSWORD,
    TEST_ADMIN_USERNAME,
    CoordinatorProcess,
)

from .release import REPO, Release

#: The chaos soak's coordinator timings (short, so a roll crosses many leases).
HEARTBEAT_MS = 250
MEMBER_LEASE_MS = 2_000
REBALANCE_TIMEOUT_MS = 4_000
DRAIN_S = 45.0


@dataclass(frozen=True)
class Side:
    """One release a process can run: its interpreter and its code."""

    name: str
    python: str
    root: Path

    @classmethod
    def current(cls) -> Side:
        return cls("new", sys.executable, REPO)

    @classmethod
    def of(cls, release: Release, name: str = "old") -> Side:
        return cls(name, str(release.python), release.source)

    def env(self, base: dict[str, str]) -> dict[str, str]:
        env = dict(os.environ)
        env.update(base)
        env["PYTHONPATH"] = str(self.root)  # this release's code, never another's
        env["PYTHONUNBUFFERED"] = "1"
        return env


class SideApp(AppProcess):
    """``python -m streamkit run`` from one release's interpreter and tree."""

    def __init__(self, side: Side, target: str, env: dict[str, str], log_path: Path) -> None:
        super().__init__(target, env, log_path)
        self.side = side

    def start(self) -> SideApp:
        self._spawn(
            [self.side.python, "-m", "streamkit", "run", self.target],
            env=self.side.env(self.env),
            cwd=self.side.root,
        )
        self.died_ns = None
        return self


@dataclass
class Fleet:
    workdir: Path
    prefix: str = "upgrade"
    group: str = "roll"
    shards: int = 8
    rate: float = 40.0
    redis: RedisServer | None = None
    lb: ChaosProxy = field(default_factory=lambda: ChaosProxy([]))
    coordinators: list[tuple[Side, CoordinatorProcess]] = field(default_factory=list)
    consumers: list[tuple[Side, SideApp]] = field(default_factory=list)
    publisher: tuple[Side, subprocess.Popen[bytes]] | None = None
    record_files: list[Path] = field(default_factory=list)
    died_ns: dict[int, int] = field(default_factory=dict)
    spans: list[checks.FaultSpan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _launched: list[CoordinatorProcess] = field(default_factory=list)
    _starts: int = 0

    def note(self, text: str) -> None:
        self.notes.append(f"{time.monotonic():.2f} {text}")

    @property
    def redis_url(self) -> str:
        assert self.redis is not None
        return f"redis://{HOST}:{self.redis.port}/0"

    def client_env(self) -> dict[str, str]:
        return {
            "STREAMKIT_COORDINATOR_URL": self.lb.url,
            "STREAMKIT_REDIS_URL": self.redis_url,
            "STREAMKIT_COORDINATOR_USERNAME": TEST_ADMIN_USERNAME,
            "STREAMKIT_COORDINATOR_PASSWORD": TEST_ADMIN_PASSWORD,
            "STREAMKIT_COORDINATOR_TIMEOUT": "2.0",
            "STREAMKIT_REDIS_SOCKET_TIMEOUT": "3.0",
            "STREAMKIT_REDIS_CONNECT_TIMEOUT": "2.0",
            "SKC_PREFIX": self.prefix,
            "SKC_GROUP": self.group,
        }

    # -- set-up ------------------------------------------------------------------

    async def start(
        self, coordinators: list[Side], consumers: list[Side], publisher: Side | None
    ) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        await self.lb.start()
        self.redis = await asyncio.to_thread(RedisServer().start)
        await asyncio.gather(*(self.add_coordinator(side) for side in coordinators))
        await self.create_group()
        if publisher is None:
            return
        for side in consumers:
            self.add_consumer(side)
        self.start_publisher(publisher)
        # A loaded machine takes seconds to start a Python process: the load
        # starts once every process works, not when it was spawned.
        await self.ready(self.record_files, self.workdir / "publisher.rec")

    async def ready(self, *records: Path | list[Path], within: float = 90.0) -> None:
        """Wait until each record file holds a first record (a consumer's
        assignment, the publisher's first entry)."""
        files = [f for r in records for f in (r if isinstance(r, list) else [r])]
        await _until(lambda: all(f.exists() and f.stat().st_size > 0 for f in files), files, within)
        self.note(f"ready: {', '.join(f.name for f in files)}")

    async def add_coordinator(self, side: Side) -> CoordinatorProcess:
        proc = CoordinatorProcess(
            self.redis_url,
            heartbeat_interval_ms=HEARTBEAT_MS,
            member_lease_ttl_ms=MEMBER_LEASE_MS,
            rebalance_timeout_ms=REBALANCE_TIMEOUT_MS,
            tick_interval_ms=100,
            python=side.python,
            cwd=side.root,
            env={"PYTHONPATH": str(side.root)},
        )
        self._launched.append(proc)
        await asyncio.to_thread(proc.start)
        self.coordinators.append((side, proc))
        self.lb.switch([p.port for _, p in self.coordinators], cut=False)
        self.note(f"coordinator {side.name} :{proc.port} started ({proc.coordinator_id})")
        return proc

    async def stop_coordinator(self, proc: CoordinatorProcess) -> None:
        """Out of the balancer, then SIGTERM (its open connections die with it)."""
        self.coordinators = [(s, p) for s, p in self.coordinators if p is not proc]
        self.lb.switch([p.port for _, p in self.coordinators], cut=False)
        code = await asyncio.to_thread(proc.stop)
        self.note(f"coordinator :{proc.port} stopped (status {code})")

    async def create_group(self) -> None:
        path = f"/coord/v1/streams/{self.prefix}/groups/{self.group}"
        body = {"initialShardCount": self.shards, "requestedBy": "upgrade", "reason": "roll"}
        auth = (TEST_ADMIN_USERNAME, TEST_ADMIN_PASSWORD)
        async with httpx.AsyncClient(base_url=self.lb.url, auth=auth, timeout=5) as http:
            response = await http.post(path, json=body)
        assert response.status_code in (200, 201), response.text

    def add_consumer(self, side: Side) -> SideApp:
        n = self._starts
        self._starts += 1
        record = self.workdir / f"consumer-{n}-{side.name}.rec"
        self.record_files.append(record)
        env = dict(self.client_env(), SKC_RECORD=str(record), STREAMKIT_MEMBER_ID_BASE=f"c{n}")
        proc = SideApp(side, "tests.chaos.app:app", env, self.workdir / f"consumer-{n}.log")
        self.consumers.append((side, proc.start()))
        self.note(f"consumer {n} {side.name} pid {proc.pid} started")
        return proc

    async def stop_consumer(self, proc: SideApp, within: float = 15.0) -> None:
        """Graceful stop (SIGTERM: the member leaves); SIGKILL past ``within``."""
        self.consumers = [(s, p) for s, p in self.consumers if p is not proc]
        try:
            code = await proc.terminate(within)
        except AssertionError:
            proc.kill()
            code = -9
        self.died_ns[proc.pid] = proc.died_ns or time.monotonic_ns()
        self.note(f"consumer pid {proc.pid} stopped (status {code})")

    def start_publisher(self, side: Side) -> None:
        env = dict(
            self.client_env(),
            SKC_RECORD=str(self.workdir / "publisher.rec"),
            SKC_RATE=str(self.rate),
            STREAMKIT_ROUTING_REFRESH_INTERVAL="0.5",
            STREAMKIT_ROUTING_LEASE="3.0",
        )
        with open(self.workdir / "publisher.log", "ab") as log:
            proc = subprocess.Popen(
                [side.python, "-m", "tests.chaos.publisher"],
                env=side.env(env),
                cwd=side.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.publisher = (side, proc)
        self.note(f"publisher {side.name} pid {proc.pid} started")

    async def stop_publisher(self) -> None:
        if self.publisher is None:
            return
        _, proc = self.publisher
        self.publisher = None
        await sigterm_then_kill(proc)

    # -- the roll ------------------------------------------------------------------

    async def replace_coordinator(self, index: int, to: Side, overlap_s: float = 1.0) -> None:
        began = time.monotonic_ns()
        _, old = self.coordinators[index]
        await self.add_coordinator(to)
        await asyncio.sleep(overlap_s)
        # Evidence that both releases were answering (in notes.log).
        with contextlib.suppress(httpx.HTTPError):
            self.note(f"heartbeats answered so far: {await self.heartbeats_answered()}")
        await self.stop_coordinator(old)
        self.spans.append(checks.FaultSpan(f"coordinator to {to.name}", began, time.monotonic_ns()))

    async def replace_consumer(self, index: int, to: Side, overlap_s: float = 1.0) -> None:
        began = time.monotonic_ns()
        _, old = self.consumers[index]
        self.add_consumer(to)
        await self.ready(self.record_files[-1])  # as a readiness probe would
        await asyncio.sleep(overlap_s)
        await self.stop_consumer(old)
        self.spans.append(checks.FaultSpan(f"consumer to {to.name}", began, time.monotonic_ns()))

    async def replace_publisher(self, to: Side) -> None:
        began = time.monotonic_ns()
        await self.stop_publisher()  # it goes on after the last seq its record holds
        self.start_publisher(to)
        record = self.workdir / "publisher.rec"
        published = record.stat().st_size
        await _until(lambda: record.stat().st_size > published, "the publisher's first entry")
        self.spans.append(checks.FaultSpan(f"publisher to {to.name}", began, time.monotonic_ns()))

    async def roll(self, to: Side, dwell_s: float) -> None:
        """Every process to ``to``, one at a time, ``dwell_s`` between steps:
        the coordinators first (members of the other release heartbeat to
        them meanwhile), then the publisher, then the consumers."""
        for _ in range(len(self.coordinators)):
            await self.replace_coordinator(0, to)
            await asyncio.sleep(dwell_s)
        await self.replace_publisher(to)
        await asyncio.sleep(dwell_s)
        for _ in range(len(self.consumers)):
            await self.replace_consumer(0, to)
            await asyncio.sleep(dwell_s)

    async def heartbeats_answered(self) -> dict[str, dict[str, float]]:
        """Per running coordinator (``<release> :<port>``), the heartbeats it
        answered so far by status (a 503 refusal is not among them)."""
        out: dict[str, dict[str, float]] = {}
        auth = (TEST_ADMIN_USERNAME, TEST_ADMIN_PASSWORD)
        head = 'redis_stream_coord_heartbeats_total{status="'
        async with httpx.AsyncClient(auth=auth, timeout=5) as http:
            for side, proc in self.coordinators:
                text = (await http.get(f"{proc.url}/metrics")).text
                out[f"{side.name} :{proc.port}"] = {
                    line[len(head) :].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith(head)
                }
        return out

    # -- the verdict -------------------------------------------------------------------

    def records(self) -> checks.Records:
        return checks.parse(
            self.workdir / "publisher.rec", self.record_files, self.died_ns, time.monotonic_ns()
        )

    async def finish(self) -> checks.Verdict:
        """Stop publishing, wait until every entry was handled, stop the consumers, judge."""
        await self.stop_publisher()
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            if not checks.judge(self.records(), [], []).lost:
                break
            await asyncio.sleep(0.5)
        await asyncio.gather(*(self.stop_consumer(p) for _, p in list(self.consumers)))
        (self.workdir / "notes.log").write_text("\n".join(self.notes) + "\n")
        return checks.judge(self.records(), [], self.spans)

    async def close(self) -> None:
        if self.publisher is not None:
            self.publisher[1].kill()
            self.publisher[1].wait(5)
        for _, proc in list(self.consumers):
            proc.cleanup()
        for proc in self._launched:
            with contextlib.suppress(OSError):
                shutil.copy(proc.log_path, self.workdir / f"coordinator-{proc.port}.log")
            await asyncio.to_thread(proc.cleanup)
        await self.lb.close()
        if self.redis is not None:
            await asyncio.to_thread(self.redis.stop)


async def _until(check: Callable[[], bool], what: object, within: float = 90.0) -> None:
    deadline = time.monotonic() + within
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not started within {within:.0f} s: {what}")
        await asyncio.sleep(0.1)


def summary(verdict: checks.Verdict) -> str:
    dups = sum(verdict.duplicates.values())
    return (
        f"published {verdict.published}, handled {verdict.handled}, lost {len(verdict.lost)}, "
        f"overlaps {len(verdict.overlaps)}, "
        f"reads without lease {len(verdict.reads_without_lease)}, "
        f"order violations {len(verdict.order_violations)}, duplicates {dups}, "
        f"max reconvergence {verdict.max_reconvergence_s:.1f} s"
    )
