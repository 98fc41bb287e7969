"""Benchmark: coordinator heartbeats against a trivial endpoint of the same app.

Starts its own private redis-server and one coordinator subprocess (via
``streamkit.testing``), lets simulated members join and settle, then measures
closed-loop heartbeats for a fixed time over keep-alive connections (raw
HTTP/1.1 from bench/rawhttp.py: httpx would cost more CPU than the server),
against a trivial authenticated GET of the same app.  Besides the throughput
ratio it prints the ratio of coordinator CPU per request (from /proc), which
is what bounds the coordinator's throughput on a machine where the client and
redis-server take their share of the cores.

Run: python bench/heartbeat.py [--seconds 10]   (about a minute in total)
     python bench/heartbeat.py --ratio-only --seconds 5   (heartbeat vs trivial only)
     python bench/heartbeat.py --sizes-only --seconds 5   (1 x 1,000 vs 1 x 10 only)
     python bench/heartbeat.py --profile /tmp/spy   (py-spy on PATH: ``pip install
     py-spy``; one collapsed-stack file of the coordinator per scenario)

Then a paced fleet at the default heartbeat interval (3 s) and the server's
default rate limits: the largest group the defaults allow (1,024 members)
joins at once and heartbeats once per interval; every 429 is counted, and the
busiest heartbeat-interval window is compared with the per-group limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio
from rawhttp import Pipe, auth_head, request_bytes

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess

API = "/coord/v1"
CONNECTIONS = 64


@dataclass(eq=False)
class Member:
    group: str
    member_id: str
    epoch: int = 0
    version: int = 0
    owned: set[int] = field(default_factory=set)
    revoked: set[int] = field(default_factory=set)
    stable: bool = False
    # The request as sent, encoded once per member state (see ``request``).
    wire: bytes = b""
    wire_key: tuple[Any, ...] = ()
    last_answer: bytes = b""
    # Groups of one stream share its shard count: other counts get a stream of their own.
    stream: str = "bench"

    def request(self, head: bytes) -> bytes:
        """The raw HTTP request of this member's next heartbeat."""
        key = (self.epoch, self.version, frozenset(self.owned), frozenset(self.revoked))
        if key != self.wire_key:
            body = json.dumps(self.body(), separators=(",", ":")).encode()
            path = (
                f"{API}/streams/{self.stream}/groups/{self.group}/members/{self.member_id}"
                "/heartbeat"
            )
            self.wire = request_bytes("POST", path, head, body)
            self.wire_key = key
        return self.wire

    def body(self) -> dict[str, Any]:
        return {
            "protocolVersion": 1,
            "requestId": "r",
            "memberId": self.member_id,
            "memberEpoch": self.epoch,
            "metadataVersion": self.version,
            "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
            "ownedShards": [{"shardIndex": s} for s in sorted(self.owned)],
            "revokingShards": [
                {"shard": {"shardIndex": s}, "state": "REVOKED", "inFlight": 0}
                for s in sorted(self.revoked)
            ],
        }

    def apply(self, data: dict[str, Any]) -> None:
        status = data["status"]
        if status in ("UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH"):
            self.epoch, self.owned, self.revoked = 0, set(), set()
            return
        if status == "RETRY":
            return
        self.epoch = data["memberEpoch"]
        self.version = data["metadataVersion"]
        assigned = {s["shardIndex"] for s in data["assignment"]["assignedShards"]}
        pending = data["assignment"]["pendingShards"]
        # Drained at once: reported REVOKED on the next heartbeat.
        self.revoked = self.owned - assigned
        self.owned = assigned if status == "OK" else self.owned & assigned
        self.stable = status == "OK" and not pending and not self.revoked


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    name: str
    count: int
    seconds: float
    latencies: list[float]
    server_cpu: float
    #: Bytes the coordinator sent to Redis (INFO stats total_net_input_bytes):
    #: every command and script argument, so an upper bound of what it wrote.
    redis_bytes: int = 0
    #: Answers 429 TOO_MANY_REQUESTS (rate limited): 0 for a healthy fleet.
    limited: int = 0

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def cpu_ms(self) -> float:
        return self.server_cpu / max(1, self.count) * 1000

    @property
    def bytes_per_req(self) -> float:
        return self.redis_bytes / max(1, self.count)

    def line(self) -> str:
        return (
            f"{self.name:<52} {self.rate:8.0f}/s  p50 {self.pct(0.5):6.1f} ms  "
            f"p99 {self.pct(0.99):6.1f} ms  server CPU {self.cpu_ms:5.2f} ms/req  "
            f"Redis in {self.bytes_per_req:8.0f} B/req  429s {self.limited}"
        )


async def _redis_input_bytes(url: str) -> int:
    client = redis.asyncio.Redis.from_url(url)
    try:
        return int((await client.info("stats"))["total_net_input_bytes"])
    finally:
        await client.aclose()


async def _settle(
    http: httpx.AsyncClient, coord: CoordinatorProcess, members: list[Member]
) -> None:
    # At most one request per connection at a time: a thousand requests queued
    # on the pool race uvicorn's keep-alive expiry (httpx.ReadError).
    slots = asyncio.Semaphore(CONNECTIONS)

    async def one(m: Member) -> None:
        async with slots:
            for _attempt in range(3):
                try:
                    r = await http.post(f"{API}/streams/{m.stream}/groups/{m.group}/members/"
                                        f"{m.member_id}/heartbeat", json=m.body())  # fmt: skip
                except httpx.TransportError:
                    continue
                m.apply(r.json())
                return

    for _ in range(40):
        await asyncio.gather(*(one(m) for m in members))
        if all(m.stable for m in members):
            return
    raise RuntimeError("members did not settle")


async def _measure(
    name: str, redis_url: str, coord: CoordinatorProcess, http: httpx.AsyncClient,
    members: list[Member], seconds: float, trivial: bool = False,
    concurrency: int = CONNECTIONS,
) -> Result:  # fmt: skip
    latencies: list[float] = []
    limited = 0
    stop = time.monotonic() + seconds
    assert coord.pid is not None
    bytes0 = await _redis_input_bytes(redis_url)
    cpu0 = _cpu_seconds(coord.pid)

    head = await auth_head(coord.url, coord.member_auth, AUTH_SCHEME)
    trivial_request = request_bytes("GET", f"{API}/monitoring/compatibility", head)

    async def loop(mine: list[Member]) -> None:
        # One connection per worker, one request at a time on it, cycling
        # through its members; raw HTTP/1.1 (bench/rawhttp.py), since httpx
        # costs more CPU per request than the coordinator does.
        nonlocal limited
        pipe = await Pipe.open(coord.url)
        n = 0
        try:
            while time.monotonic() < stop:
                m = mine[n % len(mine)]
                n += 1
                started = time.perf_counter()
                request = trivial_request if trivial else m.request(head)
                ((status, body),) = await pipe.exchange([request])
                if status == 429:
                    limited += 1
                    continue
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
                if not trivial and body != m.last_answer:
                    m.apply(json.loads(body))
                    m.last_answer = body
                latencies.append(time.perf_counter() - started)
        finally:
            pipe.close()

    t0 = time.monotonic()
    workers = min(concurrency, len(members))
    spy = await _start_profiler(name, coord.pid, seconds)
    await asyncio.gather(*(loop(members[w::workers]) for w in range(workers)))
    elapsed = time.monotonic() - t0
    if spy is not None:
        await spy.wait()
    cpu = _cpu_seconds(coord.pid) - cpu0
    written = await _redis_input_bytes(redis_url) - bytes0
    return Result(name, len(latencies), elapsed, latencies, cpu, written, limited)


#: --profile DIR: py-spy records the coordinator during each closed-loop scenario.
PROFILE_DIR: str | None = None
#: --auth: "bearer" logs in once, as streamkit members do; "basic" sends the
#: password with every request (and pays the login limiter's checks each time).
AUTH_SCHEME = "bearer"


async def _start_profiler(name: str, pid: int, seconds: float) -> asyncio.subprocess.Process | None:
    """``py-spy record`` of the coordinator for the scenario (collapsed stacks)."""
    if PROFILE_DIR is None:
        return None
    out = os.path.join(PROFILE_DIR, re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".txt")
    return await asyncio.create_subprocess_exec(
        "py-spy", "record", "--format", "raw", "--rate", "250", "--nonblocking",
        "--duration", str(max(1, int(seconds) - 1)), "--pid", str(pid), "--output", out,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


@dataclass
class FleetResult:
    members: int
    sent: int
    statuses: dict[int, int]
    busiest_window: int
    limit: int
    seconds: float

    def line(self) -> str:
        return (
            f"paced fleet, 1 group x {self.members} members at the default 3 s interval: "
            f"{self.sent} requests in {self.seconds:.1f} s ({self.sent / self.seconds:.0f}/s, "
            f"paced target {self.members / 3:.0f}/s), "
            f"HTTP statuses {dict(sorted(self.statuses.items()))}, "
            f"429s {self.statuses.get(429, 0)}; busiest 3 s window {self.busiest_window} "
            f"vs limit {self.limit} per group (headroom {self.limit / self.busiest_window:.1f}x)"
        )


async def _paced_fleet(coord: CoordinatorProcess, seconds: float, members: int) -> FleetResult:
    """Every member joins at once, then heartbeats once per interval (jittered start)."""
    interval = 3.0  # the server's default HEARTBEAT_INTERVAL_MS
    limit = 10 * 1024  # default HEARTBEAT_RATE_MULTIPLE x MAX_MEMBERS_PER_GROUP
    limits = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
    statuses: dict[int, int] = {}
    sent_at: list[float] = []
    slots = asyncio.Semaphore(CONNECTIONS)
    async with httpx.AsyncClient(
        base_url=coord.url, limits=limits, timeout=30, auth=coord.member_auth
    ) as http:
        r = await http.post(f"{API}/streams/bench/groups/fleet",
                            json={"initialShardCount": 16, "requestedBy": "bench"},
                            auth=coord.admin_auth)  # fmt: skip
        r.raise_for_status()
        fleet = [Member("fleet", f"f{i}") for i in range(members)]
        start = time.monotonic()
        stop = start + seconds

        async def beat(m: Member) -> None:
            path = f"{API}/streams/bench/groups/fleet/members/{m.member_id}/heartbeat"
            async with slots:
                for _attempt in range(3):
                    sent_at.append(time.monotonic())
                    try:
                        r = await http.post(path, json=m.body())
                        break
                    except httpx.TransportError:
                        # A keep-alive connection the server closed as it was
                        # reused: resent, as a consumer's client does.
                        continue
                else:
                    raise RuntimeError(f"heartbeat of {m.member_id} failed three times")
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code == 200:
                m.apply(r.json())

        async def member(m: Member, offset: float) -> None:
            await beat(m)  # the cold start: everyone joins at once
            next_at = start + offset
            while True:
                next_at += interval
                if next_at >= stop:
                    return
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                await beat(m)

        await asyncio.gather(*(member(m, interval * i / members) for i, m in enumerate(fleet)))
        r = await http.request("DELETE", f"{API}/streams/bench/groups/fleet",
                               json={"requestedBy": "bench", "reason": "bench", "force": True},
                               auth=coord.admin_auth)  # fmt: skip
        r.raise_for_status()
    sent_at.sort()
    busiest, lo = 0, 0
    for hi, t in enumerate(sent_at):  # sliding 3 s window over the send times
        while sent_at[lo] < t - interval:
            lo += 1
        busiest = max(busiest, hi - lo + 1)
    span = sent_at[-1] - sent_at[0] if len(sent_at) > 1 else 1.0
    return FleetResult(members, len(sent_at), statuses, busiest, limit, span)


async def _scenario(
    redis_url: str,
    coord: CoordinatorProcess,
    groups: int,
    per_group: int,
    seconds: float,
    trivial_too: bool,
    concurrency: int = CONNECTIONS,
    shards: int = 16,
) -> list[Result]:
    limits = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
    async with httpx.AsyncClient(
        base_url=coord.url, limits=limits, timeout=30, auth=coord.member_auth
    ) as http:
        prefix = f"g{groups}x{per_group}"
        stream = "bench" if shards == 16 else f"bench{shards}"
        names = [f"{prefix}-{g}" for g in range(groups)]
        for name in names:
            r = await http.post(f"{API}/streams/{stream}/groups/{name}",
                                json={"initialShardCount": shards, "requestedBy": "bench"},
                                auth=coord.admin_auth)  # fmt: skip
            r.raise_for_status()
        members = [Member(n, f"m{i}", stream=stream) for n in names for i in range(per_group)]
        await _settle(http, coord, members)
        label = f"{groups} group(s) x {per_group} members, {shards} shards"
        label += f", {min(concurrency, len(members))} in flight"
        results = [
            await _measure(
                f"heartbeat, {label}", redis_url, coord, http, members, seconds,
                concurrency=concurrency,
            )
        ]  # fmt: skip
        if trivial_too:
            results.append(
                await _measure(
                    "trivial GET compatibility", redis_url, coord, http, members, seconds, True
                )
            )
        # Deleted, or their members' leases would run out during the next
        # scenario and its figures would include those expiries.
        for name in names:
            r = await http.request("DELETE", f"{API}/streams/{stream}/groups/{name}",
                                   json={"requestedBy": "bench", "reason": "bench", "force": True},
                                   auth=coord.admin_auth)  # fmt: skip
            r.raise_for_status()
        return results


async def _fleet_only(seconds: float, members: int) -> None:
    with RedisServer() as redis, CoordinatorProcess(
        redis.url, heartbeat_interval_ms=3000, member_lease_ttl_ms=60_000,
        rebalance_timeout_ms=60_000, tick_interval_ms=1000,
    ) as coord:  # fmt: skip
        print((await _paced_fleet(coord, max(seconds, 12.0), members)).line())


async def _ratio_only(seconds: float) -> None:
    """Heartbeat against trivial only, twice, on 2 x 50 members: minutes shorter
    than the whole run (no 1,000-member groups to settle), for a loaded machine."""
    with RedisServer() as redis, CoordinatorProcess(
        redis.url, heartbeat_interval_ms=3000, member_lease_ttl_ms=60_000,
        rebalance_timeout_ms=60_000, tick_interval_ms=1000,
    ) as coord:  # fmt: skip
        pairs = [await _scenario(redis.url, coord, 2, 50, seconds, True) for _ in range(2)]
    for hb, trivial in pairs:
        print(hb.line())
        print(trivial.line())
        print(f"heartbeat/trivial throughput ratio: {hb.rate / trivial.rate:.2f}; "
              f"by coordinator CPU per request: {trivial.cpu_ms / hb.cpu_ms:.2f}")  # fmt: skip


async def _sizes_only(seconds: float) -> None:
    """1 x 1,000 against 1 x 10 only (16 shards each, 10 in flight): the group-size
    figure without the 10 x 100, 1,000-shard and fleet scenarios."""
    with RedisServer() as redis, CoordinatorProcess(
        redis.url, heartbeat_interval_ms=3000, member_lease_ttl_ms=60_000,
        rebalance_timeout_ms=60_000, tick_interval_ms=1000,
    ) as coord:  # fmt: skip
        (big,) = await _scenario(redis.url, coord, 1, 1000, seconds, False, concurrency=10)
        (small,) = await _scenario(redis.url, coord, 1, 10, seconds, trivial_too=False)
    print(big.line())
    print(small.line())
    print(f"1x1000 vs 1x10 per-heartbeat server CPU ratio: {big.cpu_ms / small.cpu_ms:.2f}")


async def _main(seconds: float) -> None:
    print(f"machine: {os.cpu_count()} cores; closed loop, {CONNECTIONS} keep-alive connections; "
          f"client, coordinator and redis-server share the machine; {AUTH_SCHEME} "
          "authentication")  # fmt: skip
    with RedisServer() as redis, CoordinatorProcess(
        redis.url, heartbeat_interval_ms=3000, member_lease_ttl_ms=60_000,
        rebalance_timeout_ms=60_000, tick_interval_ms=1000,
    ) as coord:  # fmt: skip
        hb, trivial = await _scenario(redis.url, coord, 10, 100, seconds, trivial_too=True)
        # The same number of requests in flight for both sizes (a 10-member
        # group cannot have more), so only the group size differs.
        (big,) = await _scenario(redis.url, coord, 1, 1000, seconds, False, concurrency=10)
        # And with a shard for every member, as a group that size would have:
        # each heartbeat's own work must not grow with the shards either.
        (wide,) = await _scenario(
            redis.url, coord, 1, 1000, seconds, False, concurrency=10, shards=1000
        )
        (small,) = await _scenario(redis.url, coord, 1, 10, seconds, trivial_too=False)
        fleet = await _paced_fleet(coord, max(seconds, 12.0), 1024)
    for result in (hb, trivial, big, wide, small):
        print(result.line())
    print(fleet.line())
    print(f"heartbeat/trivial throughput ratio: {hb.rate / trivial.rate:.2f}")
    # What the coordinator alone could sustain (one process is one core): the
    # throughput ratio once the client and redis-server are not the limit.
    print(f"heartbeat/trivial ratio by coordinator CPU per request: "
          f"{trivial.cpu_ms / hb.cpu_ms:.2f}")  # fmt: skip
    print(f"1x1000 vs 1x10 per-heartbeat server CPU ratio: {big.cpu_ms / small.cpu_ms:.2f}")
    print(f"1x1000 with 1,000 shards vs 1x10 per-heartbeat server CPU ratio: "
          f"{wide.cpu_ms / small.cpu_ms:.2f}")  # fmt: skip
    print(f"1x1000 vs 1x10 per-heartbeat wall-time ratio (1/throughput): "
          f"{small.rate / big.rate:.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each scenario")
    parser.add_argument("--fleet-only", action="store_true", help="only the paced fleet")
    parser.add_argument("--fleet-members", type=int, default=1024, help="with --fleet-only")
    parser.add_argument(
        "--ratio-only", action="store_true", help="only heartbeat vs trivial, twice, 2 x 50"
    )
    parser.add_argument("--sizes-only", action="store_true", help="only 1 x 1,000 against 1 x 10")
    parser.add_argument(
        "--profile", metavar="DIR", help="record the coordinator with py-spy per scenario"
    )
    parser.add_argument(
        "--auth", choices=["bearer", "basic"], default="bearer",
        help="bearer: log in once, as streamkit members do (default)",
    )  # fmt: skip
    args = parser.parse_args()
    global PROFILE_DIR, AUTH_SCHEME
    PROFILE_DIR = args.profile
    AUTH_SCHEME = args.auth
    if PROFILE_DIR:
        os.makedirs(PROFILE_DIR, exist_ok=True)
    if args.fleet_only:
        asyncio.run(_fleet_only(args.seconds, args.fleet_members))
    elif args.ratio_only:
        asyncio.run(_ratio_only(args.seconds))
    elif args.sizes_only:
        asyncio.run(_sizes_only(args.seconds))
    else:
        asyncio.run(_main(args.seconds))


if __name__ == "__main__":
    main()
