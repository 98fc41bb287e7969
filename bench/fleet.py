"""Benchmark: a fleet of 100 groups x 100 members against one and two coordinators.

Starts a private redis-server and one, then two, coordinator processes on it
(via ``streamkit.testing``).  10,000 simulated members join and settle, then
heartbeat in a closed loop (a compressed interval: as fast as the client
can), each request sent to a coordinator picked at random, so both processes
serve every group and contend on its mutex.

The client must cost less than the coordinators, so it is not httpx: several
client processes (``--clients``), each owning whole groups, speak raw
HTTP/1.1 over asyncio streams, keep-alive connections (optionally with
pipelined requests), request bytes encoded once per member state and answers
parsed only when they differ from that member's previous one.

Members are interleaved across groups so that the requests in flight belong
to different groups, as at a real interval (3 s between a member's
heartbeats, a few milliseconds each): the coordinator's per-group batching of
concurrent heartbeats (coordination/executor.py) barely applies; its mean batch size is
printed from /metrics.

Reports:

* coordinator CPU time per heartbeat (utime + stime of the coordinator
  processes from /proc/<pid>/stat over the measurement), and what it means at
  the default 3 s interval: members served per coordinator core
  (3 s / CPU per heartbeat);
* the coordinators' CPU at rest for 5 s after the loop (every member still
  alive: tick passes over every group, the limiter, metrics), and from it the
  same fleet at its real pace: that fixed cost plus each heartbeat's own (the
  loop's CPU less the fixed cost, per heartbeat) x members / 3 s, as cores
  and as members per core;
* the share of steady writes that went to Redis in a pipeline shared with
  other groups' (``streamkit_server/store/batch.py``) and its mean size.
  It depends on how many requests the coordinator has at once: each
  connection is served one request at a time.  The default shape (2 clients
  x 32 lanes, one request at a time on each: 64 connections, no pipelining)
  is the closest to a fleet, whose members each hold a connection of their
  own and send one heartbeat at a time (httpx does not pipeline);
  ``--lanes 2 --depth 16`` (4 connections, 16 pipelined requests each, the
  default until 2026-12-02) lets few writes meet;
* p50/p99 latency of the closed loop (a request's time in its pipeline);
* that no shard ever had two readers, checked from the responses: a member
  reads a shard from the OK answer that assigns it until an answer takes it
  away, and no two members of a group may read the same shard at once.

Run: python bench/fleet.py [--seconds 15] [--groups 100] [--members 100] [--clients 2]
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import multiprocessing
import os
import random
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import httpx
from heartbeat import API, Member, _cpu_seconds, _redis_input_bytes
from rawhttp import Pipe, auth_head

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess

LEASE_MS = 600_000
IDLE_S = 5.0
SETTINGS = {
    "heartbeat_interval_ms": 3000,
    # Long enough that a member is never expired while the closed loop gets
    # round to it again (10,000 members share the client's cores).
    "member_lease_ttl_ms": LEASE_MS,
    "rebalance_timeout_ms": LEASE_MS,
    "tick_interval_ms": 1000,
}
STREAM = "fleet"


@dataclass
class Readers:
    """Who reads each shard, from the answers; counts two readers at once."""

    readers: dict[tuple[str, int], Member] = field(default_factory=dict)
    violations: int = 0

    def record(self, member: Member, before: set[int]) -> None:
        for shard in before - member.owned:
            if self.readers.get((member.group, shard)) is member:
                del self.readers[(member.group, shard)]
        for shard in member.owned - before:
            holder = self.readers.get((member.group, shard))
            # Every member heartbeats far within its lease here, so a holder
            # that still owns the shard by its own answers still reads it.
            if holder is not None and holder is not member and shard in holder.owned:
                self.violations += 1
            self.readers[(member.group, shard)] = member


@dataclass
class Lane:
    """Members served in rounds: a pipelined batch per coordinator per round."""

    members: list[Member]
    pipes: list[Pipe]
    head: bytes
    readers: Readers
    depth: int
    latencies: array.array[float] = field(default_factory=lambda: array.array("d"))
    errors: int = 0
    cursor: int = 0

    async def round(self, chosen: list[Member], record: bool) -> None:
        by_pipe: list[list[Member]] = [[] for _ in self.pipes]
        for member in chosen:
            by_pipe[random.randrange(len(self.pipes))].append(member)

        async def one(pipe: Pipe, members: list[Member]) -> None:
            if not members:
                return
            started = time.perf_counter()
            answers = await pipe.exchange([m.request(self.head) for m in members])
            elapsed = time.perf_counter() - started
            for member, (status, body) in zip(members, answers, strict=True):
                if record:
                    self.latencies.append(elapsed)
                if status != 200:
                    self.errors += 1
                    continue
                if body == member.last_answer:
                    continue  # the same answer as last time: the same state
                before = set(member.owned)
                member.apply(json.loads(body))
                member.last_answer = body
                self.readers.record(member, before)

        await asyncio.gather(*(one(p, ms) for p, ms in zip(self.pipes, by_pipe, strict=True)))

    async def run_until(self, stop: float) -> None:
        while time.monotonic() < stop:
            chosen = [
                self.members[(self.cursor + i) % len(self.members)] for i in range(self.depth)
            ]
            self.cursor += self.depth
            await self.round(chosen, record=True)

    async def settle_round(self) -> None:
        for start in range(0, len(self.members), self.depth):
            await self.round(self.members[start : start + self.depth], record=False)


async def _client(
    urls: list[str], auth: tuple[str, str], groups: list[str], args: argparse.Namespace,
    conn: Connection,
) -> None:  # fmt: skip
    head = await auth_head(urls[0], auth, args.auth)
    # Interleaved: member i of every group, then member i+1 ...
    members = [Member(g, f"m{i}", stream=STREAM) for i in range(args.members) for g in groups]
    readers = Readers()
    lanes = []
    for n in range(args.lanes):
        pipes = [await Pipe.open(url) for url in urls]
        lanes.append(Lane(members[n :: args.lanes], pipes, head, readers, args.depth))
    for _ in range(40):
        await asyncio.gather(*(lane.settle_round() for lane in lanes))
        if all(m.stable for m in members):
            break
    else:
        raise RuntimeError("members did not settle")
    conn.send("settled")
    stop = conn.recv()  # the parent's monotonic deadline (same clock on Linux)
    await asyncio.gather(*(lane.run_until(stop) for lane in lanes))
    latencies = array.array("d")
    for lane in lanes:
        latencies.extend(lane.latencies)
        for pipe in lane.pipes:
            pipe.close()
    conn.send((latencies.tobytes(), sum(lane.errors for lane in lanes), readers.violations))


def _client_main(*a: Any) -> None:
    asyncio.run(_client(*a))


def _pct(values: array.array[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _create(coord: CoordinatorProcess, names: list[str]) -> None:
    async with httpx.AsyncClient(base_url=coord.url, timeout=60, auth=coord.admin_auth) as http:
        for name in names:
            r = await http.post(f"{API}/streams/{STREAM}/groups/{name}",
                                json={"initialShardCount": 16, "requestedBy": "bench"})  # fmt: skip
            r.raise_for_status()


async def _batch_sizes(coords: list[CoordinatorProcess]) -> tuple[float, float, dict[str, float]]:
    """(sum, count) of the coordinators' critical-section batch-size histograms,
    and their locked-path writes by reason (plus their steady catch-ups)."""
    total = count = 0.0
    locked: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=30) as http:
        for coord in coords:
            text = (await http.get(f"{coord.url}/metrics", auth=coord.admin_auth)).text
            for line in text.splitlines():
                if line.startswith("redis_stream_coord_batch_size_sum"):
                    total += float(line.split()[-1])
                elif line.startswith("redis_stream_coord_batch_size_count"):
                    count += float(line.split()[-1])
                elif line.startswith("redis_stream_coord_locked_writes_total{"):
                    reason = line.split('reason="', 1)[1].split('"', 1)[0]
                    locked[reason] = locked.get(reason, 0.0) + float(line.split()[-1])
                elif line.startswith("redis_stream_coord_steady_catch_ups_total "):
                    # Not a locked write: one-round-trip writes that also caught
                    # the copy up on another process's member writes.
                    locked["(catch-ups)"] = locked.get("(catch-ups)", 0.0) + float(line.split()[-1])
                elif line.startswith("redis_stream_coord_steady_pipeline_size_sum "):
                    # Steady writes that shared a pipeline (store/batch.py).
                    locked["(pipelined)"] = locked.get("(pipelined)", 0.0) + float(line.split()[-1])
                elif line.startswith("redis_stream_coord_steady_pipeline_size_count "):
                    locked["(pipelines)"] = locked.get("(pipelines)", 0.0) + float(line.split()[-1])
    return total, count, locked


def _scenario(redis: RedisServer, processes: int, args: argparse.Namespace) -> None:
    coords = [CoordinatorProcess(redis.url, **SETTINGS) for _ in range(processes)]  # type: ignore[arg-type]
    for coord in coords:
        coord.start()
    ctx = multiprocessing.get_context("fork")
    clients: list[tuple[Any, Connection]] = []
    try:
        names = [f"p{processes}-{g}" for g in range(args.groups)]
        asyncio.run(_create(coords[0], names))
        urls = [c.url for c in coords]
        settle_started = time.monotonic()
        for n in range(args.clients):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_client_main,
                args=(urls, coords[0].admin_auth, names[n :: args.clients], args, theirs),
            )
            proc.start()
            theirs.close()  # so that a client that dies is an EOFError here, not a hang
            clients.append((proc, mine))
        for _proc, conn in clients:
            if conn.recv() != "settled":
                raise RuntimeError("a client failed")
        settled = time.monotonic() - settle_started
        pids = [c.pid for c in coords if c.pid is not None]
        batches0 = asyncio.run(_batch_sizes(coords))
        bytes0 = asyncio.run(_redis_input_bytes(redis.url))
        cpu0 = sum(_cpu_seconds(p) for p in pids)
        t0 = time.monotonic()
        for _proc, conn in clients:
            conn.send(t0 + args.seconds)
        latencies: array.array[float] = array.array("d")
        errors = violations = 0
        for _proc, conn in clients:
            raw, errs, viol = conn.recv()
            latencies.frombytes(raw)
            errors += errs
            violations += viol
        elapsed = time.monotonic() - t0
        cpu = sum(_cpu_seconds(p) for p in pids) - cpu0
        written = asyncio.run(_redis_input_bytes(redis.url)) - bytes0
        batches1 = asyncio.run(_batch_sizes(coords))
        # The fleet at rest (the leases are long): what the coordinators spend
        # per second without heartbeats (tick passes over every group, the
        # limiter, metrics), a cost the closed loop spreads over its own rate.
        idle0 = sum(_cpu_seconds(p) for p in pids)
        time.sleep(IDLE_S)
        idle = (sum(_cpu_seconds(p) for p in pids) - idle0) / IDLE_S
    finally:
        for proc, _conn in clients:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        for coord in coords:
            coord.stop()
    count = len(latencies)
    cpu_per_hb = cpu / max(1, count)
    batch = (batches1[0] - batches0[0]) / max(1.0, batches1[1] - batches0[1])
    print(f"{processes} coordinator process(es), {args.groups} groups x {args.members} members, "
          f"{args.clients} client processes x {args.lanes} lanes x {args.depth} pipelined "
          f"(settled in {settled:.0f} s)")  # fmt: skip
    print(f"  steady heartbeats      {count / elapsed:8.0f}/s   p50 {_pct(latencies, 0.5):6.1f} ms"
          f"   p99 {_pct(latencies, 0.99):6.1f} ms   non-200 answers: {errors}")  # fmt: skip
    print(f"  coordinator CPU        {cpu_per_hb * 1000:8.3f} ms/heartbeat "
          f"(all processes; {cpu / elapsed:.2f} cores busy); mean batch {batch:.2f}")  # fmt: skip
    print(f"  Redis input            {written / max(1, count):8.0f} B/heartbeat")
    locked = {
        reason: n - batches0[2].get(reason, 0.0)
        for reason, n in batches1[2].items()
        if n - batches0[2].get(reason, 0.0) > 0
    }
    sections = max(1.0, batches1[1] - batches0[1])
    catch_ups = locked.pop("(catch-ups)", 0.0)
    pipelined = locked.pop("(pipelined)", 0.0)
    pipelines = locked.pop("(pipelines)", 0.0)
    print(f"  locked-path writes     {sum(locked.values()) / sections:8.1%} of critical sections "
          f"{dict(sorted(locked.items()))}")  # fmt: skip
    print(
        f"  steady catch-ups       {catch_ups / sections:8.1%} of critical sections "
        "(one round trip on a copy another process's member writes had passed)"
    )
    print(
        f"  shared pipelines       {pipelined / sections:8.1%} of critical sections "
        f"wrote in one with others (mean {pipelined / max(1.0, pipelines):.1f} writes each)"
    )
    print(f"  members per coordinator core at 3 s interval: {3 / cpu_per_hb:,.0f}")
    # The same fleet at its real pace: the fixed cost per second plus each
    # heartbeat's own (the closed loop's CPU less the fixed cost, per heartbeat).
    marginal = max(0.0, cpu - idle * elapsed) / max(1, count)
    fleet = args.groups * args.members
    needed = idle + fleet / 3 * marginal
    print(f"  at rest (no heartbeats)  {idle:8.3f} cores busy; per heartbeat beyond that "
          f"{marginal * 1000:.3f} ms")  # fmt: skip
    print(f"  this fleet at 3 s interval: {needed:.2f} coordinator cores, "
          f"{fleet / max(needed, 1e-9):,.0f} members per core")  # fmt: skip
    print(f"  two readers of one shard (from responses): {violations}")
    if violations:
        raise SystemExit("two readers observed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="steady measurement time")
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--members", type=int, default=100, help="members per group")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--lanes", type=int, default=32,
                        help="request lanes (connections) per client")  # fmt: skip
    parser.add_argument("--depth", type=int, default=1, help="requests per pipelined batch")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2],
                        help="coordinator process counts to run")  # fmt: skip
    parser.add_argument("--auth", choices=["bearer", "basic"], default="bearer",
                        help="bearer: log in once, as streamkit members do (default)")  # fmt: skip
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; client, "
          f"coordinators and redis-server share it; {args.auth} authentication")  # fmt: skip
    with RedisServer() as redis:
        for processes in args.processes:
            _scenario(redis, processes, args)


if __name__ == "__main__":
    main()
