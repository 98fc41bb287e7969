"""Benchmark: a fleet of 100 groups x 100 members against one and two coordinators.

Starts a private redis-server and one, then two, coordinator processes on it
(via ``streamkit.testing``).  10,000 simulated members join and settle, then
heartbeat in a closed loop (a compressed interval: as fast as the client
can), each request sent to a coordinator picked at random, so both processes
serve every group and contend on its mutex.  Reports:

* coordinator CPU per heartbeat, and what it means at the default 3 s
  interval: members served per coordinator core (3 s / CPU per heartbeat);
* p50/p99 latency of the closed loop;
* that no shard ever had two readers, checked from the responses: a member
  reads a shard from the OK answer that assigns it until an answer takes it
  away, and no two members may read the same shard of a group at once.

Run: python bench/fleet.py [--seconds 15] [--groups 100] [--members 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from dataclasses import dataclass

import httpx
from heartbeat import API, CONNECTIONS, Member, _cpu_seconds, _redis_input_bytes

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess

LEASE_MS = 600_000
SETTINGS = {
    "heartbeat_interval_ms": 3000,
    # Long enough that a member is never expired while the closed loop gets
    # round to it again (10,000 members share the client's two cores).
    "member_lease_ttl_ms": LEASE_MS,
    "rebalance_timeout_ms": LEASE_MS,
    "tick_interval_ms": 1000,
}


@dataclass
class Fleet:
    members: list[Member]
    # (group, shard) -> the member that reads it, from the responses.
    readers: dict[tuple[str, int], Member]
    # When each member last got an answer: past its lease it has stopped
    # reading (its local lease ran out), whatever it was told before.
    answered: dict[int, float]
    violations: int = 0

    def record(self, member: Member, before: set[int]) -> None:
        now = time.monotonic()
        self.answered[id(member)] = now
        for shard in before - member.owned:
            if self.readers.get((member.group, shard)) is member:
                del self.readers[(member.group, shard)]
        for shard in member.owned - before:
            holder = self.readers.get((member.group, shard))
            if (
                holder is not None
                and holder is not member
                and shard in holder.owned
                and now - self.answered.get(id(holder), 0) < LEASE_MS / 1000
            ):
                self.violations += 1
            self.readers[(member.group, shard)] = member


async def _send(http: httpx.AsyncClient, url: str, fleet: Fleet, m: Member) -> float:
    path = f"{url}{API}/streams/fleet/groups/{m.group}/members/{m.member_id}/heartbeat"
    started = time.perf_counter()
    for _attempt in range(3):
        try:
            r = await http.post(path, json=m.body())
        except httpx.TransportError:
            continue
        r.raise_for_status()
        before = set(m.owned)
        m.apply(r.json())
        fleet.record(m, before)
        break
    return time.perf_counter() - started


async def _settle(http: httpx.AsyncClient, urls: list[str], fleet: Fleet) -> None:
    """Rounds in which every member heartbeats, until all are stable.

    A stable member must keep heartbeating: a newcomer's shards are taken
    from it only when it hears so.
    """
    slots = asyncio.Semaphore(CONNECTIONS * len(urls))

    async def one(m: Member) -> None:
        async with slots:
            await _send(http, random.choice(urls), fleet, m)

    for _ in range(40):
        await asyncio.gather(*(one(m) for m in fleet.members))
        if all(m.stable for m in fleet.members):
            return
    raise RuntimeError("members did not settle")


async def _run(
    http: httpx.AsyncClient, urls: list[str], fleet: Fleet, seconds: float
) -> list[float]:
    """Closed loop over the fleet for ``seconds``."""
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    workers = CONNECTIONS * len(urls)

    async def loop(mine: list[Member]) -> None:
        n = 0
        while time.monotonic() < stop:
            m = mine[n % len(mine)]
            n += 1
            latencies.append(await _send(http, random.choice(urls), fleet, m))

    await asyncio.gather(*(loop(fleet.members[w::workers]) for w in range(workers)))
    return latencies


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _scenario(redis: RedisServer, processes: int, args: argparse.Namespace) -> None:
    coords = [CoordinatorProcess(redis.url, **SETTINGS) for _ in range(processes)]
    for coord in coords:
        coord.start()
    try:
        urls = [c.url for c in coords]
        pool = CONNECTIONS * processes
        limits = httpx.Limits(max_connections=pool, max_keepalive_connections=pool)
        async with httpx.AsyncClient(limits=limits, timeout=60) as http:
            tag = f"p{processes}"
            names = [f"{tag}-{g}" for g in range(args.groups)]
            for name in names:
                r = await http.post(f"{urls[0]}{API}/streams/fleet/groups/{name}",
                                    json={"initialShardCount": 16, "requestedBy": "bench"},
                                    auth=coords[0].admin_auth)  # fmt: skip
                r.raise_for_status()
            fleet = Fleet([Member(n, f"m{i}") for n in names for i in range(args.members)], {}, {})
            settle_started = time.monotonic()
            await _settle(http, urls, fleet)
            settled = time.monotonic() - settle_started
            pids = [c.pid for c in coords if c.pid is not None]
            cpu0 = sum(_cpu_seconds(p) for p in pids)
            bytes0 = await _redis_input_bytes(redis.url)
            t0 = time.monotonic()
            latencies = await _run(http, urls, fleet, args.seconds)
            elapsed = time.monotonic() - t0
            cpu = sum(_cpu_seconds(p) for p in pids) - cpu0
            written = await _redis_input_bytes(redis.url) - bytes0
    finally:
        for coord in coords:
            coord.stop()
    count = len(latencies)
    cpu_per_hb = cpu / max(1, count)
    print(f"{processes} coordinator process(es), {args.groups} groups x {args.members} members "
          f"(settled in {settled:.0f} s)")  # fmt: skip
    print(f"  steady heartbeats      {count / elapsed:8.0f}/s   p50 {_pct(latencies, 0.5):6.1f} ms"
          f"   p99 {_pct(latencies, 0.99):6.1f} ms")  # fmt: skip
    print(f"  coordinator CPU        {cpu_per_hb * 1000:8.3f} ms/heartbeat "
          f"(all processes; {cpu / elapsed:.2f} cores busy)")  # fmt: skip
    print(f"  Redis input            {written / max(1, count):8.0f} B/heartbeat")
    print(f"  members per core at 3 s interval: {3 / cpu_per_hb:,.0f}")
    print(f"  two readers of one shard (from responses): {fleet.violations}")
    if fleet.violations:
        raise SystemExit("two readers observed")


async def _main(args: argparse.Namespace) -> None:
    print(f"machine: {os.cpu_count()} cores; client, coordinators and redis-server share it; "
          f"closed loop, {CONNECTIONS} connections per coordinator")  # fmt: skip
    with RedisServer() as redis:
        for processes in (1, 2):
            await _scenario(redis, processes, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="steady measurement time")
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--members", type=int, default=100, help="members per group")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
