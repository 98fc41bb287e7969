"""Resharding under steady load: time to DEPRECATED and what consumers notice.

Run: python bench/reshard.py             (about a minute; starts its own Redis
                                           and coordinator via streamkit.testing)
     python bench/reshard.py --rate 3000 --producer-lease-ms 10000

For each mode (plain, then ordered with ``ordering: "key"``) on a fresh
stream of ``--from`` shards:

1. an in-process ``StreamKit`` app (``--concurrency`` members) consumes, and a
   ``Publisher`` publishes ``--rate`` messages/s (``publish_many`` every 10 ms,
   each message stamped with its publish time), for ``--warmup`` seconds;
2. ``POST /streams/{prefix}/scale`` to ``--to`` shards; the migration state is
   polled every 20 ms until DEPRECATED;
3. the load goes on for ``--cooldown`` seconds, then stops and the backlog is
   drained.

Reported per mode: the time from the scale request to the routing switch
(the 202 answer) and to DEPRECATED, the consume rate in 250 ms windows (mean
before the request, lowest window while the migration ran), and the
publish-to-handle latency of the messages published before and during the
migration.  The coordinator's producer routing lease is ``--producer-lease-ms``
and the publisher's routing lease matches it, as the docs require.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from streamkit import Message, StreamKit
from streamkit.publisher.publisher import Publisher
from streamkit.settings import StreamKitSettings
from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess

WINDOW_S = 0.25


@dataclass
class Sink:
    #: (handled at, published at) per handled message, first handling only.
    times: dict[str, tuple[float, float]] = field(default_factory=dict)

    async def handle(self, msg: Message) -> None:
        self.times.setdefault(msg.fields["n"], (time.time(), float(msg.fields["at"])))
        await msg.ack()


@dataclass
class Outcome:
    mode: str
    switch_s: float
    deprecated_s: float
    rate_before: float
    rate_min_during: float
    latency_before: list[float]
    latency_during: list[float]
    published: int
    handled: int


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def admin(
    http: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None = None
) -> Any:
    response = await http.request(method, f"/coord/v1{path}", json=body)
    response.raise_for_status()
    return response.json()


async def run_mode(
    coordinator: CoordinatorProcess, redis_url: str, mode: str, args: argparse.Namespace
) -> Outcome:
    prefix = f"bench-{mode}-{int(time.time())}"
    lease_s = args.producer_lease_ms / 1000
    settings = StreamKitSettings(
        coordinator_url=coordinator.url,
        coordinator_username=coordinator.admin_username,
        coordinator_password=coordinator.admin_password,
        redis_url=redis_url,
        member_id_base=f"bench-{mode}",
        routing_lease=lease_s,
        routing_refresh_interval=lease_s / 5,
    )
    async with httpx.AsyncClient(
        base_url=coordinator.url, auth=coordinator.admin_auth, timeout=30
    ) as http:
        ordering = "key" if mode == "ordered" else "none"
        await admin(
            http, "POST", f"/streams/{prefix}",
            {"initialShardCount": args.shards_from, "requestedBy": "bench", "ordering": ordering},
        )  # fmt: skip
        await admin(http, "POST", f"/streams/{prefix}/groups/g", {"requestedBy": "bench"})
        sink = Sink()
        app = StreamKit(settings)
        app.add_listener(prefix, "g", sink.handle, concurrency=args.concurrency, batch_size=100)
        publisher = Publisher(prefix, "g", settings=settings)
        published = 0
        stop = anyio.Event()

        async def load() -> None:
            nonlocal published
            per_tick = max(1, round(args.rate / 100))
            started = time.monotonic()
            tick = 0
            while not stop.is_set():
                now = repr(time.time())
                batch = [
                    (f"k{(published + i) % 1000}", {"n": published + i, "at": now})
                    for i in range(per_tick)
                ]
                await publisher.publish_many(batch)
                published += per_tick
                tick += 1
                await anyio.sleep(max(0.0, started + tick / 100 - time.monotonic()))

        async with anyio.create_task_group() as tg:
            tg.start_soon(app.serve)
            await publisher.start()
            while True:  # every member holds its share before the load starts
                body = await admin(
                    http, "GET", f"/monitoring/streams/{prefix}/groups/g/assignments"
                )
                held = [s for v in body["currentAssignments"].values() for s in v]
                if len(body["currentAssignments"]) == args.concurrency and len(held) == (
                    args.shards_from
                ):
                    break
                await anyio.sleep(0.05)
            tg.start_soon(load)
            await anyio.sleep(args.warmup)
            requested = time.time()
            answer = await admin(
                http, "POST", f"/streams/{prefix}/scale",
                {"targetShardCount": args.shards_to, "requestedBy": "bench", "reason": "bench"},
            )  # fmt: skip
            switched = time.time()
            rid = answer["migrations"][0]["reshardingId"]
            while True:
                migration = await admin(http, "GET", f"/streams/{prefix}/groups/g/migrations/{rid}")
                if migration["state"] == "DEPRECATED":
                    break
                await anyio.sleep(0.02)
            done = time.time()
            await anyio.sleep(args.cooldown)
            stop.set()
            with anyio.fail_after(60):
                while len(sink.times) < published:  # noqa: ASYNC110 (no event to wait on)
                    await anyio.sleep(0.05)
            app.shutdown()
        await publisher.aclose()

    handled_at = sorted(h for h, _ in sink.times.values())

    def rate(lo: float, hi: float) -> list[float]:
        windows = []
        t = lo
        while t + WINDOW_S <= hi:
            windows.append(sum(1 for h in handled_at if t <= h < t + WINDOW_S) / WINDOW_S)
            t += WINDOW_S
        return windows

    before = rate(requested - args.warmup + 0.5, requested)
    during = rate(requested, max(done, requested + WINDOW_S))
    return Outcome(
        mode=mode,
        switch_s=switched - requested,
        deprecated_s=done - requested,
        rate_before=statistics.mean(before),
        rate_min_during=min(during),
        latency_before=[h - p for h, p in sink.times.values() if p < requested],
        latency_during=[h - p for h, p in sink.times.values() if requested <= p < done],
        published=published,
        handled=len(sink.times),
    )


def print_table(outcomes: list[Outcome], args: argparse.Namespace) -> None:
    print(
        f"\n{args.shards_from} -> {args.shards_to} shards, {args.rate} msgs/s, "
        f"{args.concurrency} members, producer routing lease {args.producer_lease_ms} ms"
    )
    print(
        "| mode | request -> switch | request -> DEPRECATED | consume rate before "
        "| lowest 250 ms window during | latency p50 / p99 / max before "
        "| latency p50 / p99 / max during |"
    )
    print("|---|---|---|---|---|---|---|")
    for o in outcomes:
        ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731
        print(
            f"| {o.mode} | {ms(o.switch_s)} | {o.deprecated_s:.2f} s | {o.rate_before:,.0f}/s "
            f"| {o.rate_min_during:,.0f}/s "
            f"| {ms(pct(o.latency_before, 0.5))} / {ms(pct(o.latency_before, 0.99))} / "
            f"{ms(max(o.latency_before))} "
            f"| {ms(pct(o.latency_during, 0.5))} / {ms(pct(o.latency_during, 0.99))} / "
            f"{ms(max(o.latency_during))} |"
        )
    for o in outcomes:
        print(f"{o.mode}: published {o.published:,}, handled {o.handled:,} (none lost)")


async def main(args: argparse.Namespace) -> None:
    with (
        RedisServer() as redis,
        CoordinatorProcess(
            redis.url,
            heartbeat_interval_ms=1000,
            member_lease_ttl_ms=5000,
            env={"STREAMKIT_SERVER_PRODUCER_ROUTING_LEASE_MS": str(args.producer_lease_ms)},
        ) as coordinator,
    ):
        outcomes = [await run_mode(coordinator, redis.url, mode, args) for mode in args.modes]
    print_table(outcomes, args)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="shards_from", type=int, default=8)
    parser.add_argument("--to", dest="shards_to", type=int, default=16)
    parser.add_argument("--rate", type=int, default=2000, help="messages per second")
    parser.add_argument("--concurrency", type=int, default=4, help="consumer members")
    parser.add_argument("--producer-lease-ms", type=int, default=5000)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--cooldown", type=float, default=2.0)
    parser.add_argument("--modes", nargs="+", default=["plain", "ordered"])
    return parser.parse_args(argv)


if __name__ == "__main__":
    anyio.run(main, parse())
