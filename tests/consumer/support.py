"""Helpers of the consumer tests: coordinator admin calls, app subprocesses,
read-interval records and the single-reader check."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

from streamkit.protocol import (
    AssignmentsResponse,
    ConsumptionProgressResponse,
    MemberListResponse,
    shard_indexes,
)
from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit.testing.redis_server import _die_with_parent_hook

REPO = Path(__file__).resolve().parents[2]


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    within: float,
    what: str,
    interval: float = 0.05,
) -> None:
    """Poll ``check`` until it is true; fail with ``what`` after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.1f}s waiting for {what}")
        await anyio.sleep(interval)


_INCARNATION_PART = re.compile(r"-[0-9a-f]{8}(?=-m\d+\b)")


def logical(member_id: str) -> str:
    """``a-1f2e3d4c-m0`` -> ``a-m0``: a member id without its per-start part.

    Tests name processes by ``STREAMKIT_MEMBER_ID_BASE``; each start of a
    process adds a random part to its member ids (see ``member_id_prefix``).
    """
    return _INCARNATION_PART.sub("", member_id)


class Admin:
    """The coordinator's admin and monitoring API, over real HTTP."""

    def __init__(self, coordinator: CoordinatorProcess) -> None:
        self.coordinator = coordinator
        self.url = coordinator.url
        self.auth = coordinator.admin_auth

    async def _get(self, path: str) -> Any:
        async with httpx.AsyncClient(base_url=self.url, auth=self.auth, timeout=5) as http:
            response = await http.get(path)
            response.raise_for_status()
            return response.json()

    async def create_group(self, prefix: str, group: str, shards: int) -> None:
        async with httpx.AsyncClient(base_url=self.url, auth=self.auth, timeout=10) as http:
            response = await http.post(
                f"/coord/v1/streams/{prefix}/groups/{group}",
                json={"initialShardCount": shards, "requestedBy": "tests", "reason": "consumer"},
            )
            assert response.status_code in (200, 201), response.text

    async def owners(self, prefix: str, group: str, *, raw: bool = False) -> dict[str, list[int]]:
        """memberId -> shards it currently holds (current assignment).

        Member ids are ``logical`` unless ``raw``.
        """
        body = AssignmentsResponse.from_wire(
            await self._get(f"/coord/v1/monitoring/streams/{prefix}/groups/{group}/assignments")
        )
        name = (lambda m: m) if raw else logical
        return {name(m): shard_indexes(s) for m, s in body.current_assignments.items() if s}

    async def targets(self, prefix: str, group: str) -> dict[str, list[int]]:
        body = AssignmentsResponse.from_wire(
            await self._get(f"/coord/v1/monitoring/streams/{prefix}/groups/{group}/assignments")
        )
        return {logical(m): shard_indexes(s) for m, s in body.target_assignment.items() if s}

    async def consumption(self, prefix: str, group: str) -> ConsumptionProgressResponse:
        return ConsumptionProgressResponse.from_wire(
            await self._get(f"/coord/v1/monitoring/streams/{prefix}/groups/{group}/consumption")
        )

    async def members(self, prefix: str, group: str) -> MemberListResponse:
        return MemberListResponse.from_wire(
            await self._get(f"/coord/v1/monitoring/streams/{prefix}/groups/{group}/members")
        )


def settled_ownership(owners: Mapping[str, list[int]], members: Iterable[str], shards: int) -> bool:
    """Every shard held by exactly one of ``members``, spread within 1."""
    members = list(members)
    held = [s for m in members for s in owners.get(m, [])]
    if sorted(held) != list(range(shards)) or set(owners) - set(members):
        return False
    counts = [len(owners.get(m, [])) for m in members]
    return max(counts) - min(counts) <= 1


# -- app subprocesses ------------------------------------------------------------------


class AppProcess:
    """``python -m streamkit run tests.consumer.apps.<module>:app`` as a real process."""

    def __init__(
        self, target: str, env: Mapping[str, str], log_path: Path, args: Iterable[str] = ()
    ) -> None:
        self.target = target
        self.args = list(args)
        self.env = dict(env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        #: monotonic ns at which the process was known dead (after kill/exit).
        self.died_ns: int | None = None

    def start(self) -> AppProcess:
        env = dict(os.environ)
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamkit", "run", self.target, *self.args],
                env=env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent_hook(),
            )
        finally:
            log.close()
        self.died_ns = None
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash, nothing runs on the way out."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.died_ns = time.monotonic_ns()

    async def terminate(self, within: float = 20.0) -> int:
        """SIGTERM and wait for the exit status without blocking the loop."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return await self.wait(within)

    async def wait(self, within: float) -> int:
        assert self.proc is not None
        deadline = time.monotonic() + within
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.target} did not exit in {within}s:\n{self.logs()}")
            await anyio.sleep(0.02)
        self.died_ns = time.monotonic_ns()
        return self.proc.returncode

    def cleanup(self) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)

    def logs(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def app_env(
    coordinator: CoordinatorProcess,
    target: RedisTarget,
    *,
    base: str,
    prefix: str,
    group: str,
    record: Path,
    **extra: object,
) -> dict[str, str]:
    user, password = coordinator.admin_auth
    env = {
        "STREAMKIT_COORDINATOR_URL": coordinator.url,
        "STREAMKIT_COORDINATOR_USERNAME": user,
        "STREAMKIT_COORDINATOR_PASSWORD": password,
        "STREAMKIT_REDIS_URL": target.url,
        "STREAMKIT_REDIS_CLUSTER": "true" if target.cluster else "false",
        "STREAMKIT_MEMBER_ID_BASE": base,
        "SKT_PREFIX": prefix,
        "SKT_GROUP": group,
        "SKT_RECORD": str(record),
    }
    env.update({f"SKT_{k.upper()}": str(v) for k, v in extra.items()})
    return env


# -- records ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadInterval:
    shard: int
    reader: str  # "member@pid": a restarted process is another reader
    epoch: int
    start_ns: int
    end_ns: int


@dataclass
class Records:
    reads: list[ReadInterval]
    #: (shard, entry id) -> how many times a handler ran for it
    handled: dict[str, int]


def parse_records(paths: Iterable[Path], died_ns: Mapping[int, int]) -> Records:
    """Read the files the recording apps write.

    ``died_ns`` maps pid -> when the process was known dead: a read that has
    a start but no end (SIGKILL mid-read) is taken to last until then, which
    can only make the overlap check stricter.
    """
    reads: list[ReadInterval] = []
    handled: dict[str, int] = defaultdict(int)
    for path in paths:
        open_reads: dict[tuple[int, str], deque[tuple[int, int]]] = defaultdict(deque)
        for line in path.read_text().splitlines():
            parts = line.split()
            if not parts:
                continue
            kind = parts[0]
            if kind == "B":
                _, shard, member, epoch, pid_s, t = parts
                reader = f"{logical(member)}@{pid_s}"
                open_reads[(int(shard), reader)].append((int(epoch), int(t)))
            elif kind == "E":
                _, shard, member, epoch, pid_s, t, _count = parts
                key = (int(shard), f"{logical(member)}@{pid_s}")
                ep, start = open_reads[key].popleft()
                reads.append(ReadInterval(int(shard), key[1], ep, start, int(t)))
            elif kind == "H":
                handled[parts[1]] += 1
        for (index, reader), left in open_reads.items():
            end = died_ns.get(int(reader.rsplit("@", 1)[1]), time.monotonic_ns())
            reads.extend(ReadInterval(index, reader, ep, start, end) for ep, start in left)
    return Records(reads, dict(handled))


def overlapping_reads(reads: Iterable[ReadInterval]) -> list[tuple[ReadInterval, ReadInterval]]:
    """Pairs of reads of the same shard by different readers that overlap in time."""
    by_shard: dict[int, list[ReadInterval]] = defaultdict(list)
    for read in reads:
        by_shard[read.shard].append(read)
    bad: list[tuple[ReadInterval, ReadInterval]] = []
    for intervals in by_shard.values():
        intervals.sort(key=lambda r: r.start_ns)
        # Sweep: keep the read that reaches furthest per reader seen so far.
        latest: dict[str, ReadInterval] = {}
        for read in intervals:
            for reader, other in latest.items():
                if reader != read.reader and other.end_ns > read.start_ns:
                    bad.append((other, read))
            prev = latest.get(read.reader)
            if prev is None or read.end_ns > prev.end_ns:
                latest[read.reader] = read
    return bad


async def group_state(
    redis: Any, prefix: str, group: str, shards: int
) -> dict[int, dict[str, Any]]:
    """XINFO GROUPS of ``group`` on every shard stream."""
    state = {}
    for shard in range(shards):
        for info in await redis.xinfo_groups(f"{prefix}:{shard}"):
            name = info["name"]
            if (name.decode() if isinstance(name, bytes) else name) == group:
                state[shard] = info
    return state


async def all_acked(redis: Any, prefix: str, group: str, shards: int) -> bool:
    state = await group_state(redis, prefix, group, shards)
    return len(state) == shards and all(s["pending"] == 0 and s["lag"] == 0 for s in state.values())


# -- in-process apps -------------------------------------------------------------------


class MemoryRecorder:
    """A ``ReadObserver`` keeping read intervals (and handled entries) in memory."""

    def __init__(self) -> None:
        self._open: dict[tuple[int, str], deque[tuple[int, int]]] = defaultdict(deque)
        self.reads: list[ReadInterval] = []
        self.handled: list[tuple[int, str, str]] = []  # (shard, entry id, member)

    def read_started(self, shard: int, member_id: str, epoch: int) -> None:
        self._open[(shard, logical(member_id))].append((epoch, time.monotonic_ns()))

    def read_finished(self, shard: int, member_id: str, epoch: int, count: int) -> None:
        member_id = logical(member_id)
        started_epoch, start = self._open[(shard, member_id)].popleft()
        self.reads.append(ReadInterval(shard, member_id, started_epoch, start, time.monotonic_ns()))

    def open_reads(self) -> list[ReadInterval]:
        now = time.monotonic_ns()
        return [
            ReadInterval(shard, member, epoch, start, now)
            for (shard, member), items in self._open.items()
            for epoch, start in items
        ]

    def all_reads(self) -> list[ReadInterval]:
        return self.reads + self.open_reads()


def in_process_settings(
    coordinator: CoordinatorProcess, target: RedisTarget, base: str
) -> dict[str, Any]:
    """``StreamKit(**...)`` keyword overrides for an app inside the test process."""
    user, password = coordinator.admin_auth
    return {
        "coordinator_url": coordinator.url,
        "coordinator_username": user,
        "coordinator_password": password,
        "redis_url": target.url,
        "redis_cluster": target.cluster,
        "member_id_base": base,
    }


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[Any]:
    """Run ``app.serve()`` in the background; shut it down gracefully on exit."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(app.serve)
        try:
            yield app
        finally:
            app.shutdown()


# -- dead letters ------------------------------------------------------------------------


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def dead_letters(redis: Any, key: str) -> list[dict[str, str]]:
    """The entries of a dead-letter stream, decoded, oldest first."""
    return [{text(k): text(v) for k, v in fields.items()} for _, fields in await redis.xrange(key)]
