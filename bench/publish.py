"""Benchmark: Publisher against raw redis-py XADD, same shards, same run.

Starts a private redis-server (or, with --cluster, a 3-primary cluster) and a
coordinator subprocess via ``streamkit.testing``, creates an 8-shard group and
publishes N keyed ~100-byte messages in each mode:

* single:  one awaited call per message
  - raw xadd:  ``await r.xadd(key, fields, nomkstream=True)``, the shard key
               computed *before* the timed loop (raw pays no routing)
  - raw execute_command: the same command with its arguments prebuilt before
               the timed loop (skips ``xadd()``'s argument handling, which the
               publisher skips too: the strictest baseline)
  - publisher: ``await publisher.publish(partition_key, fields)``
  - publisher, coalescing off: ``Publisher(..., coalesce=False)`` (the
               behaviour before the coalescing publisher)
* batched: batches of 10, 100 and 1,000 messages
  - raw per shard:  batches of 100 grouped by shard, one pipeline per shard,
                    awaited one after the other
  - raw 1 pipeline: the whole batch in one non-transactional pipeline (what
                    the publisher does; the like-for-like baseline)
  - raw 1 pipeline, socket timeout: the same, on a client with the
                    publisher's socket timeout (redis-py then arms a timer
                    per reply; the publisher's own client has one)
  - publisher:      ``await publisher.publish_many(batch)``
* both publisher modes again with the built-in metrics and tracing middlewares
  on, once with an OTel SDK provider recording every producer span (the
  ``traceparent`` field written) and once without an SDK (API only): the
  cost of observability, as a ratio to the plain publisher
* concurrent: 1, 10 and 100 tasks, each awaiting its share one message at a time
  - raw xadd each:  every task awaits its own ``XADD`` (redis-py sends one
                    command per call, each on a pooled connection)
  - publisher, coalescing off / on: every task awaits ``publisher.publish``;
                    with coalescing, calls of one loop turn share a pipeline.
                    The ceiling is the raw one pipeline of 100.

* idempotent: ``Publisher(..., idempotent=True)`` (a drawn id per message,
  the check-and-append script) single, batched and with 100 tasks, as a
  ratio to the plain publisher in the same mode

* single-caller latency: a lone caller alternating, call by call, between the
  coalescing publisher and the one with ``coalesce=False`` (so drift in the
  machine's load hits both alike); per-call p50 / p99 of each, as a ratio.

Each round sends the N messages through every mode, interleaved in slices of
2,000 messages (rotating which mode goes first), so that noise on the shared
cores hits every mode alike; the best round of each mode is kept. Streams are
emptied (XTRIM MAXLEN 0, keys kept) after every slice, outside the timing.

Run: python bench/publish.py [--messages 100000] [--rounds 3] [--cluster]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack

import httpx
from consume import REPLY_PARSER
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from prometheus_client import CollectorRegistry

from streamkit.observability.metrics import PrometheusMiddleware
from streamkit.observability.tracing import TracingMiddleware
from streamkit.publisher.publisher import Publisher
from streamkit.routing import shard_for_key, stream_key
from streamkit.settings import StreamKitSettings
from streamkit.testing import AsyncRedisClient, RedisCluster, RedisServer, RedisTarget
from streamkit.testing import redis_client as make_client
from streamkit.testing.coordinator import CoordinatorProcess

PREFIX = "bench-orders"
GROUP = "billing"
SHARDS = 8
BATCH = 100
BATCH_SIZES = (10, 100, 1000)
TASKS = (1, 10, 100)
SLICE = 2_000  # messages per mode before switching to the next mode
PAYLOAD = "x" * 84  # with the key field: ~100 bytes of field data per message

Message = tuple[str, dict[str, str]]
Mode = Callable[[list[Message]], Awaitable[float]]  # returns seconds


def messages(n: int) -> list[Message]:
    out = []
    for i in range(n):
        key = f"customer-{i % 10_000:05d}"
        out.append((key, {"key": key, "payload": PAYLOAD}))
    return out


def raw_single(r: AsyncRedisClient) -> Mode:
    async def run(msgs: list[Message]) -> float:
        keys = [stream_key(PREFIX, shard_for_key(k, SHARDS)) for k, _ in msgs]
        started = time.perf_counter()
        for key, (_, fields) in zip(keys, msgs, strict=True):
            await r.xadd(key, fields, nomkstream=True)  # type: ignore[arg-type]
        return time.perf_counter() - started

    return run


def raw_single_command(r: AsyncRedisClient) -> Mode:
    async def run(msgs: list[Message]) -> float:
        heads = [
            ("XADD", stream_key(PREFIX, shard_for_key(k, SHARDS)), "NOMKSTREAM", "*")
            for k, _ in msgs
        ]
        flat = [[x for pair in fields.items() for x in pair] for _, fields in msgs]
        started = time.perf_counter()
        for head, args in zip(heads, flat, strict=True):
            await r.execute_command(*head, *args)
        return time.perf_counter() - started

    return run


def raw_per_shard(r: AsyncRedisClient) -> Mode:
    async def run(msgs: list[Message]) -> float:
        batches = []
        for lo in range(0, len(msgs), BATCH):
            grouped: dict[str, list[dict[str, str]]] = {}
            for k, fields in msgs[lo : lo + BATCH]:
                grouped.setdefault(stream_key(PREFIX, shard_for_key(k, SHARDS)), []).append(fields)
            batches.append(grouped)
        started = time.perf_counter()
        for grouped in batches:
            for key, entries in grouped.items():
                pipe = r.pipeline(transaction=False)
                for fields in entries:
                    pipe.xadd(key, fields, nomkstream=True)  # type: ignore[arg-type]
                await pipe.execute()
        return time.perf_counter() - started

    return run


def raw_one_pipeline(r: AsyncRedisClient, size: int = BATCH) -> Mode:
    async def run(msgs: list[Message]) -> float:
        keys = [stream_key(PREFIX, shard_for_key(k, SHARDS)) for k, _ in msgs]
        started = time.perf_counter()
        for lo in range(0, len(msgs), size):
            pipe = r.pipeline(transaction=False)
            for key, (_, fields) in zip(keys[lo : lo + size], msgs[lo : lo + size], strict=True):
                pipe.xadd(key, fields, nomkstream=True)  # type: ignore[arg-type]
            await pipe.execute()
        return time.perf_counter() - started

    return run


async def _in_tasks(
    msgs: list[Message], tasks: int, one: Callable[[Message], Awaitable[object]]
) -> float:
    """``tasks`` concurrent tasks, each awaiting its share of ``msgs`` one by one."""

    async def worker(share: list[Message]) -> None:
        for msg in share:
            await one(msg)

    started = time.perf_counter()
    await asyncio.gather(*(worker(msgs[t::tasks]) for t in range(tasks)))
    return time.perf_counter() - started


def raw_concurrent(r: AsyncRedisClient, tasks: int) -> Mode:
    async def run(msgs: list[Message]) -> float:
        heads = {k: stream_key(PREFIX, shard_for_key(k, SHARDS)) for k, _ in msgs}

        async def one(msg: Message) -> object:
            return await r.xadd(heads[msg[0]], msg[1], nomkstream=True)  # type: ignore[arg-type]

        return await _in_tasks(msgs, tasks, one)

    return run


def publisher_concurrent(pub: Publisher, tasks: int) -> Mode:
    async def run(msgs: list[Message]) -> float:
        async def one(msg: Message) -> object:
            return await pub.publish(msg[0], msg[1])

        return await _in_tasks(msgs, tasks, one)

    return run


def publisher_single(pub: Publisher) -> Mode:
    async def run(msgs: list[Message]) -> float:
        started = time.perf_counter()
        for key, fields in msgs:
            await pub.publish(key, fields)
        return time.perf_counter() - started

    return run


def publisher_batched(pub: Publisher, size: int = BATCH) -> Mode:
    async def run(msgs: list[Message]) -> float:
        started = time.perf_counter()
        for lo in range(0, len(msgs), size):
            await pub.publish_many(msgs[lo : lo + size])
        return time.perf_counter() - started

    return run


async def bench(
    target: RedisTarget,
    coordinator: CoordinatorProcess,
    n: int,
    rounds: int,
    only: Sequence[str] = (),
) -> None:
    async with httpx.AsyncClient(base_url=coordinator.url, auth=coordinator.admin_auth) as http:
        answer = await http.post(
            f"/coord/v1/streams/{PREFIX}/groups/{GROUP}",
            json={"initialShardCount": SHARDS, "requestedBy": "bench", "reason": "bench"},
        )
        answer.raise_for_status()
    user, password = coordinator.admin_auth
    settings = StreamKitSettings(
        coordinator_url=coordinator.url,
        coordinator_username=user,
        coordinator_password=password,
        redis_url=target.url,
        redis_cluster=target.cluster,
    )
    raw = make_client(target)
    # The publisher's own client has a socket timeout (safe default); redis-py
    # then arms a timer for every reply it reads. The same client setting on
    # the raw side shows what that costs, apart from the publisher's own work.
    raw_timed = make_client(target, socket_timeout=settings.redis_socket_timeout)
    pub = Publisher(PREFIX, GROUP, settings=settings)  # its own Redis client, like an app's
    await pub.start()
    # The same with the built-in metrics middleware and tracing on: an OTel SDK
    # provider recording every producer span (no exporter: that is the app's
    # cost) and the traceparent field written into every entry.
    sdk = TracerProvider()
    observed = Publisher(
        PREFIX,
        GROUP,
        settings=settings,
        middlewares=[PrometheusMiddleware(CollectorRegistry()), TracingMiddleware()],
    )
    observed.tracer = sdk.get_tracer("streamkit")
    await observed.start()
    # What a high-volume service runs: the SDK sampling 1 % of the traces at
    # the head (every entry still carries a traceparent, flags 00 mostly).
    one_percent = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))
    sampled = Publisher(
        PREFIX,
        GROUP,
        settings=settings,
        middlewares=[PrometheusMiddleware(CollectorRegistry()), TracingMiddleware()],
    )
    sampled.tracer = one_percent.get_tracer("streamkit")
    await sampled.start()
    # The same middlewares without an SDK (the API's no-op): an app that only
    # wants metrics.
    metered = Publisher(
        PREFIX,
        GROUP,
        settings=settings,
        middlewares=[PrometheusMiddleware(CollectorRegistry()), TracingMiddleware()],
    )
    await metered.start()
    # Today's behaviour for the concurrent pattern: every call its own round trip.
    plain = Publisher(PREFIX, GROUP, settings=settings, coalesce=False)
    await plain.start()
    idem = Publisher(PREFIX, GROUP, settings=settings, idempotent=True)
    await idem.start()
    msgs = messages(n)
    modes: dict[str, Mode] = {
        "single  raw xadd": raw_single(raw),
        "single  raw execute_command": raw_single_command(raw),
        "single  publisher.publish": publisher_single(pub),
        "single  publish, metrics+tracing": publisher_single(observed),
        "single  publish, metrics+tracing API": publisher_single(metered),
        "single  publish, metrics+tracing 1%": publisher_single(sampled),
        "batched raw, pipeline per shard": raw_per_shard(raw),
        "batched raw, one pipeline": raw_one_pipeline(raw),
        "batched publisher.publish_many": publisher_batched(pub),
        "batched publish_many, metrics+tracing": publisher_batched(observed),
        "batched publish_many, metrics+tracing API": publisher_batched(metered),
        "batched publish_many, metrics+tracing 1%": publisher_batched(sampled),
        "single  publisher, coalescing off": publisher_single(plain),
        "single  publish, idempotent": publisher_single(idem),
        "batched publish_many, idempotent": publisher_batched(idem),
        "100 tasks publisher, idempotent": publisher_concurrent(idem, 100),
    }
    for size in BATCH_SIZES:
        modes[f"batch {size:<4} raw, one pipeline"] = raw_one_pipeline(raw, size)
        modes[f"batch {size:<4} publisher.publish_many"] = publisher_batched(pub, size)
    modes[f"batch {BATCH:<4} raw, one pipeline, socket timeout"] = raw_one_pipeline(raw_timed)
    for tasks in TASKS:
        modes[f"{tasks:>3} tasks raw xadd each"] = raw_concurrent(raw, tasks)
        modes[f"{tasks:>3} tasks publisher, coalescing off"] = publisher_concurrent(plain, tasks)
        modes[f"{tasks:>3} tasks publisher.publish"] = publisher_concurrent(pub, tasks)
    if only:  # a subset (and every mode a ratio of it needs is the caller's choice)
        modes = {name: mode for name, mode in modes.items() if any(o in name for o in only)}
    rates: dict[str, list[float]] = {name: [] for name in modes}
    # This process' CPU time per message, over all rounds: steadier than
    # wall-clock rates for a cost of a few µs in a ~200 µs round trip.
    cpu = dict.fromkeys(modes, 0.0)
    names = list(modes)
    try:
        for mode in modes.values():  # warm up connections and caches
            await mode(msgs[:SLICE])
        for r in range(rounds):
            elapsed = dict.fromkeys(names, 0.0)
            # Interleave the modes slice by slice (rotating who goes first), so a
            # noisy moment on the shared 2 cores hits every mode alike.
            for number, lo in enumerate(range(0, n, SLICE)):
                for name in names[number % len(names) :] + names[: number % len(names)]:
                    cpu_before = time.process_time()
                    elapsed[name] += await modes[name](msgs[lo : lo + SLICE])
                    cpu[name] += time.process_time() - cpu_before
                    for shard in range(SHARDS):
                        await raw.xtrim(stream_key(PREFIX, shard), maxlen=0)
            for name in names:
                rates[name].append(n / elapsed[name])
            print(f"round {r + 1}/{rounds} done", flush=True)
        await lone_caller_latency(pub, plain, msgs[: min(len(msgs), 10_000)])
    finally:
        await pub.aclose()
        await observed.aclose()
        await metered.aclose()
        await sampled.aclose()
        await plain.aclose()
        await idem.aclose()
        await raw.aclose()
        await raw_timed.aclose()

    best = {name: max(values) for name, values in rates.items()}
    print(f"\n{n:,} messages, {SHARDS} shards, {target.kind} Redis, best of {rounds} rounds, "
          f"reply parser: {REPLY_PARSER}")  # fmt: skip
    for name, values in rates.items():
        print(
            f"  {name:<48}{best[name]:>10,.0f} msgs/s   (median {statistics.median(values):,.0f})"
        )

    def ratio(label: str, num: str, den: str) -> None:
        if num in best and den in best:
            print(f"  {label:<58} = {best[num] / best[den]:.2f}x")

    print()
    ratio("single: publisher / raw xadd", "single  publisher.publish", "single  raw xadd")
    ratio(
        "single: publisher / raw execute_command",
        "single  publisher.publish",
        "single  raw execute_command",
    )
    ratio(
        "single: coalescing on / off",
        "single  publisher.publish",
        "single  publisher, coalescing off",
    )
    ratio(
        "batch 100: publish_many / raw pipeline per shard",
        f"batch {BATCH:<4} publisher.publish_many",
        "batched raw, pipeline per shard",
    )
    for size in BATCH_SIZES:
        ratio(
            f"batch {size}: publish_many / raw one pipeline",
            f"batch {size:<4} publisher.publish_many",
            f"batch {size:<4} raw, one pipeline",
        )
    ratio(
        f"batch {BATCH}: publish_many / raw one pipeline, same socket timeout",
        f"batch {BATCH:<4} publisher.publish_many",
        f"batch {BATCH:<4} raw, one pipeline, socket timeout",
    )
    for tasks in TASKS:
        ratio(
            f"{tasks} tasks: publisher / raw xadd each",
            f"{tasks:>3} tasks publisher.publish",
            f"{tasks:>3} tasks raw xadd each",
        )
        ratio(
            f"{tasks} tasks: publisher / raw one pipeline of {BATCH}",
            f"{tasks:>3} tasks publisher.publish",
            f"batch {BATCH:<4} raw, one pipeline",
        )
        ratio(
            f"{tasks} tasks: coalescing on / off",
            f"{tasks:>3} tasks publisher.publish",
            f"{tasks:>3} tasks publisher, coalescing off",
        )
    for label, on, off in (
        ("single", "single  publish, idempotent", "single  publisher.publish"),
        ("batch 100", "batched publish_many, idempotent", "batched publisher.publish_many"),
        ("100 tasks", "100 tasks publisher, idempotent", "100 tasks publisher.publish"),
    ):
        if on in best and off in best:  # cost per entry: time ratio = inverse rate ratio
            print(f"  {label + ': idempotent / plain publish, time per entry':<58} = "
                  f"{best[off] / best[on]:.2f}x")  # fmt: skip
    # Tracing's cost (with --only too, when the modes ran): the SDK sampling 1 %
    # and recording every span, against the same publisher without middlewares.
    for mode in ("single  publish", "batched publish_many"):
        off = "single  publisher.publish" if mode.startswith("single") else (
            "batched publisher.publish_many")  # fmt: skip
        ratio(f"{mode.split()[0]}: metrics+tracing (SDK 1 %) / off", f"{mode}, metrics+tracing 1%",
              off)  # fmt: skip
        ratio(f"{mode.split()[0]}: metrics+tracing (SDK all) / off", f"{mode}, metrics+tracing",
              off)  # fmt: skip
    # CPU per message is steadier than msgs/s on a shared machine (a round
    # trip here is hundreds of µs, the tracing cost a few): with --only too.
    sent_all = n * rounds
    for mode in ("single  publish", "batched publish_many"):
        off = "single  publisher.publish" if mode.startswith("single") else (
            "batched publisher.publish_many")  # fmt: skip
        for suffix in ("metrics+tracing 1%", "metrics+tracing"):
            on = f"{mode}, {suffix}"
            if on in cpu and off in cpu:
                off_us, on_us = cpu[off] / sent_all * 1e6, cpu[on] / sent_all * 1e6
                print(f"  CPU per message {on:<44}{on_us:>7.1f} µs (off {off_us:.1f})"
                      f"  off / on = {off_us / on_us:.0%}")  # fmt: skip
    if only:
        return
    single = best["single  publisher.publish"] / best["single  raw xadd"]
    single_cmd = best["single  publisher.publish"] / best["single  raw execute_command"]
    per_shard = best["batched publisher.publish_many"] / best["batched raw, pipeline per shard"]
    one = best["batched publisher.publish_many"] / best["batched raw, one pipeline"]
    print(f"\n  single:  publisher / raw xadd                = {single:.0%}")
    print(f"  single:  publisher / raw execute_command     = {single_cmd:.0%}")
    print(f"  batched: publisher / raw pipeline per shard = {per_shard:.0%}")
    print(f"  batched: publisher / raw one pipeline       = {one:.0%}")
    obs_single = best["single  publish, metrics+tracing"] / best["single  publisher.publish"]
    obs_batch = (
        best["batched publish_many, metrics+tracing"] / best["batched publisher.publish_many"]
    )
    api_single = best["single  publish, metrics+tracing API"] / best["single  publisher.publish"]
    api_batch = (
        best["batched publish_many, metrics+tracing API"] / best["batched publisher.publish_many"]
    )
    print(f"  single:  metrics+tracing (SDK) on / off      = {obs_single:.0%}")
    print(f"  batched: metrics+tracing (SDK) on / off      = {obs_batch:.0%}")
    print(f"  single:  metrics+tracing (API only) on / off = {api_single:.0%}")
    print(f"  batched: metrics+tracing (API only) on / off = {api_batch:.0%}")
    sent = n * rounds
    print("\n  this process' CPU µs per message (all rounds), and off / on:")
    for off, on in (
        ("single  publisher.publish", "single  publish, metrics+tracing API"),
        ("single  publisher.publish", "single  publish, metrics+tracing"),
        ("batched publisher.publish_many", "batched publish_many, metrics+tracing API"),
        ("batched publisher.publish_many", "batched publish_many, metrics+tracing"),
    ):
        off_us, on_us = cpu[off] / sent * 1e6, cpu[on] / sent * 1e6
        print(f"  {on:<48}{on_us:>8.1f} µs  (off {off_us:.1f} µs)  {off_us / on_us:.0%}")
    print(
        f"  publisher counters: published={pub.published} retries={pub.retries} "
        f"refreshes={pub.refresher.refreshes}"
    )


async def lone_caller_latency(pub: Publisher, plain: Publisher, msgs: list[Message]) -> None:
    """One caller, alternating call by call: coalescing on vs off, per-call latency."""
    on: list[float] = []
    off: list[float] = []
    for n, (key, fields) in enumerate(msgs):
        first, second = (pub, on), (plain, off)
        for publisher, into in (first, second) if n % 2 else (second, first):
            started = time.perf_counter()
            await publisher.publish(key, fields)
            into.append(time.perf_counter() - started)
    on.sort()
    off.sort()

    def at(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] * 1e6

    print(f"\n  lone caller, {len(msgs):,} calls each, alternating (µs per call):")
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        print(f"    {label}: coalescing on {at(on, q):7.1f}   off {at(off, q):7.1f}   "
              f"on / off = {at(on, q) / at(off, q):.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cluster", action="store_true", help="3-primary Redis Cluster")
    parser.add_argument(
        "--only",
        nargs="+",
        default=(),
        metavar="TEXT",
        help="run only the modes whose name contains one of these (e.g. 'tasks' 'batch 100')",
    )
    args = parser.parse_args()
    with ExitStack() as stack:
        if args.cluster:
            cluster = stack.enter_context(RedisCluster(primaries=3))
            target = RedisTarget(cluster.url, cluster=True)
        else:
            server = stack.enter_context(RedisServer())
            target = RedisTarget(server.url, cluster=False)
        coordinator = stack.enter_context(CoordinatorProcess(target.url, cluster=target.cluster))
        asyncio.run(bench(target, coordinator, args.messages, args.rounds, args.only))


if __name__ == "__main__":
    main()
