"""Helpers of the consumer tests: read-interval records and the single-reader and
single-processor checks.  The admin client, ``eventually`` and the app
process launcher are the shared ones (``tests/helpers.py``)."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from helpers import REPO, Admin, AppProcess, eventually, in_process_settings, logical

from streamkit import StreamKit
from streamkit.demo.dev import client_env
from streamkit.scripts import slot_key
from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

__all__ = ["REPO", "Admin", "AppProcess", "eventually", "in_process_settings", "logical"]


def settled_ownership(owners: Mapping[str, list[int]], members: Iterable[str], shards: int) -> bool:
    """Every shard held by exactly one of ``members``, spread within 1."""
    members = list(members)
    held = [s for m in members for s in owners.get(m, [])]
    if sorted(held) != list(range(shards)) or set(owners) - set(members):
        return False
    counts = [len(owners.get(m, [])) for m in members]
    return max(counts) - min(counts) <= 1


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
    env = client_env(coordinator, target.url, target.cluster)
    env.update(
        STREAMKIT_MEMBER_ID_BASE=base, SKT_PREFIX=prefix, SKT_GROUP=group, SKT_RECORD=str(record)
    )
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
    #: One interval per handler call: start to finish, with the reader's epoch.
    processing: list[ReadInterval] = field(default_factory=list)
    #: reader ("member@pid") -> when it lost its shards (fenced or forgotten)
    lost: dict[str, list[int]] = field(default_factory=dict)


def parse_records(paths: Iterable[Path], died_ns: Mapping[int, int]) -> Records:
    """Read the files the recording apps write.

    ``died_ns`` maps pid -> when the process was known dead: a read that has
    a start but no end (SIGKILL mid-read) is taken to last until then, which
    can only make the overlap check stricter.
    """
    records = Records([], {})
    handled: dict[str, int] = defaultdict(int)
    lost: dict[str, list[int]] = defaultdict(list)
    for path in paths:
        open_reads: dict[tuple[int, str], deque[tuple[int, int]]] = defaultdict(deque)
        # Handler calls of one entry: keyed by the entry as well.
        open_calls: dict[tuple[int, str], dict[str, tuple[int, int]]] = defaultdict(dict)
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
                records.reads.append(ReadInterval(int(shard), key[1], ep, start, int(t)))
            elif kind == "S":
                _, shard, member, epoch, pid_s, t, entry = parts
                open_calls[(int(shard), f"{member}@{pid_s}")][entry] = (int(epoch), int(t))
            elif kind == "F":
                _, shard, member, _epoch, pid_s, t, entry = parts
                key = (int(shard), f"{member}@{pid_s}")
                ep, start = open_calls[key].pop(entry)
                records.processing.append(ReadInterval(int(shard), key[1], ep, start, int(t)))
            elif kind == "L":
                _, member, pid_s, t = parts
                lost[f"{member}@{pid_s}"].append(int(t))
            elif kind == "H":
                handled[parts[1]] += 1
        for (index, reader), left in open_reads.items():
            end = died_ns.get(int(reader.rsplit("@", 1)[1]), time.monotonic_ns())
            records.reads.extend(ReadInterval(index, reader, ep, start, end) for ep, start in left)
        for (index, reader), calls in open_calls.items():
            end = died_ns.get(int(reader.rsplit("@", 1)[1]), time.monotonic_ns())
            records.processing.extend(
                ReadInterval(index, reader, ep, start, end) for ep, start in calls.values()
            )
    records.handled = dict(handled)
    records.lost = dict(lost)
    return records


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


def overlapping_processing(
    calls: Iterable[ReadInterval], lost: Mapping[str, Iterable[int]] | None = None
) -> list[tuple[ReadInterval, ReadInterval]]:
    """Pairs of handler calls on one shard by different members that overlap in time.

    The documented exception: a handler that was already running when its
    member lost the shard (fenced, or forgotten after its lease ended) is not
    cancelled, so it may overlap the next owner's calls.  ``lost`` maps a reader
    to the times it lost its shards.
    """
    losses = {reader: sorted(times) for reader, times in (lost or {}).items()}

    def cut_off(call: ReadInterval) -> bool:
        return any(call.start_ns <= t <= call.end_ns for t in losses.get(call.reader, ()))

    return [(a, b) for a, b in overlapping_reads(calls) if not (cut_off(a) or cut_off(b))]


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


async def pending(redis: Any, key: str, group: str) -> int:
    """How many entries of the stream ``key`` wait for an ack from ``group``."""
    return int((await redis.xpending(key, group))["pending"])


async def nothing_pending(redis: Any, prefix: str, group: str, shards: int) -> bool:
    """No shard of ``prefix`` has an entry pending for ``group`` (read and not acked)."""
    for shard in range(shards):
        if await pending(redis, f"{prefix}:{shard}", group):
            return False
    return True


async def effect_count(redis: Any, prefix: str, shards: int) -> int:
    """The sum of the per-shard counters the counting handlers' effects
    increment (field ``n`` of the hash ``count`` in each shard's slot)."""
    total = 0
    for shard in range(shards):
        total += int(await redis.hget(slot_key(f"{prefix}:{shard}", "count"), "n") or 0)
    return total


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


#: ``make_app(base, **options)`` (the fixture): an in-process app of the test.
InProcessApp = Callable[..., StreamKit]


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
