"""End-to-end consume throughput: a streamkit app against a raw redis-py loop.

Run: python bench/consume.py            (about a minute; starts its own Redis
                                          and coordinator via streamkit.testing)
     python bench/consume.py --messages 20000 --concurrency 1
     python bench/consume.py --observability --repeat 3   (middlewares on vs off)

Both sides read the same pre-published backlog (``--messages`` entries of
~100 bytes over ``--shards`` shard streams), each through its own consumer
group, in the same process and event loop type, one after the other:

* raw: one asyncio task per shard doing ``XREADGROUP COUNT <batch>`` then one
  ``XACK`` of the whole batch, until the shard is empty;
* streamkit: an in-process ``StreamKit`` app, ``concurrency`` members, the
  handler only does ``await msg.ack()``.

The streamkit clock starts at the first handler call, after the members have
joined and settled: the group is parked at the end of the streams (``XGROUP
SETID $``) while they join, then moved back to the start (``SETID 0``), so
join and rebalance time is not counted, only steady-state consumption.

Failure runs (``--failing-percent``, default 1): the same app where the
handler raises for about that share of the entries (chosen by a hash of the
entry id, so every retry of one fails too), with a failure policy of 3
attempts and a 50 ms backoff, after which the entry is dead-lettered. The
figure is the throughput of the *healthy* entries (the clock stops when the
last healthy one is handled) next to an all-healthy run of the same listener,
unordered and ordered. An ordered shard waits while its failing entry is
retried, so only the unordered figure can stay close to the healthy run.

Idle shards (``--idle-shards``, default 64; 0 skips it): one entry per second
per shard over that many shards, paced, for ``--idle-seconds``; the streamkit
app (one member, default options) and then a raw loop (one task per shard:
``XREADGROUP COUNT 100 BLOCK 2000`` then ``XACK``) consume it. The figure is
Redis commands per handled entry, from ``INFO commandstats`` deltas over the
run (``XREADGROUP`` and ``XACK``, and every other command that is not the
publisher's ``XADD``: the coordinator shares this Redis, so that column is an
upper bound of the consumer's other commands).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import statistics
import time
import zlib
from collections.abc import Sequence
from typing import Any

import anyio
import httpx
from redis.utils import HIREDIS_AVAILABLE

from streamkit import Message, StreamKit
from streamkit.consumer.failure import FailurePolicy, dead_letter_key
from streamkit.middleware import Middleware
from streamkit.testing import RedisServer, RedisTarget, redis_client
from streamkit.testing.coordinator import CoordinatorProcess

#: Which reply parser redis-py uses here: with hiredis (C) installed, a read
#: costs a fraction of the pure-Python parser's, which moves every ratio.
REPLY_PARSER = "hiredis" if HIREDIS_AVAILABLE else "pure Python (no hiredis)"

PAYLOAD = "x" * 90  # + field name and id overhead: ~100 bytes per entry


async def create_group(
    coordinator: CoordinatorProcess, prefix: str, group: str, shards: int
) -> None:
    async with httpx.AsyncClient(base_url=coordinator.url, auth=coordinator.admin_auth) as http:
        response = await http.post(
            f"/coord/v1/streams/{prefix}/groups/{group}",
            json={"initialShardCount": shards, "requestedBy": "bench", "reason": "consume"},
        )
        response.raise_for_status()


async def owners(coordinator: CoordinatorProcess, prefix: str, group: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=coordinator.url, auth=coordinator.admin_auth) as http:
        response = await http.get(
            f"/coord/v1/monitoring/streams/{prefix}/groups/{group}/assignments"
        )
        response.raise_for_status()
        current: dict[str, Any] = response.json()["currentAssignments"]
        # Member ids carry a per-start incarnation ({base}-{incarnation}-m{i});
        # the caller knows only the logical id {base}-m{i}.
        return {
            re.sub(r"-[0-9a-f]{8}(-m\d+)$", r"\1", member): shards
            for member, shards in current.items()
            if shards
        }


def head_sampled_traceparent(i: int, rng: random.Random) -> str:
    """The ``traceparent`` a publisher sampling 1 % at the head writes: 1 in 100
    flagged sampled."""
    flags = "01" if i % 100 == 0 else "00"
    return f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64) | 1:016x}-{flags}"


def bench_coordinator(redis_url: str) -> CoordinatorProcess:
    """The coordinator the consume and latency benchmarks run against."""
    return CoordinatorProcess(
        redis_url,
        heartbeat_interval_ms=1_000,
        member_lease_ttl_ms=5_000,
        rebalance_timeout_ms=10_000,
        tick_interval_ms=200,
    )


async def prepublish(
    redis: Any, prefix: str, shards: int, messages: int, traced: bool = False
) -> None:
    """The backlog. ``traced``: every entry carries a ``traceparent``, as written by
    a publisher whose tracer samples 1 % at the head (1 in 100 flagged sampled)."""
    chunk = 5_000
    rng = random.Random(1)
    for start in range(0, messages, chunk):
        pipe = redis.pipeline(transaction=False)
        for i in range(start, min(start + chunk, messages)):
            fields = {"payload": PAYLOAD}
            if traced:
                fields["traceparent"] = head_sampled_traceparent(i, rng)
            pipe.xadd(f"{prefix}:{i % shards}", fields)
        await pipe.execute()


async def raw_loop(redis: Any, prefix: str, shards: int, batch: int, group: str) -> float:
    for shard in range(shards):
        await redis.xgroup_create(f"{prefix}:{shard}", group, "0")
    total = 0

    async def one_shard(key: str) -> None:
        nonlocal total
        while True:
            reply = await redis.xreadgroup(group, "raw", {key: ">"}, count=batch)
            if not reply or not reply[0][1]:
                return
            entries = reply[0][1]
            await redis.xack(key, group, *[entry_id for entry_id, _ in entries])
            total += len(entries)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for shard in range(shards):
            tg.start_soon(one_shard, f"{prefix}:{shard}")
    elapsed = time.perf_counter() - start
    return total / elapsed


async def streamkit_run(
    coordinator: CoordinatorProcess,
    target: RedisTarget,
    redis: Any,
    prefix: str,
    shards: int,
    batch: int,
    concurrency: int,
    tag: str,
    *,
    ordered: bool = True,
    failing_percent: float = 0.0,
    middlewares: Sequence[Middleware] = (),
    cpu: list[float] | None = None,
    idempotent: bool = False,
) -> float:
    """Messages per second; with failures, of the healthy entries only.

    ``cpu`` gets this process' CPU time per handled entry, in µs: what the
    client spends, which other processes on a loaded machine do not inflate
    the way they stretch wall-clock time.
    """
    group = f"sk{tag}"
    await create_group(coordinator, prefix, group, shards)
    for shard in range(shards):  # park the group at the end while members join
        await redis.xgroup_setid(f"{prefix}:{shard}", group, "$")
    user, password = coordinator.admin_auth
    app = StreamKit(
        coordinator_url=coordinator.url,
        coordinator_username=user,
        coordinator_password=password,
        redis_url=target.url,
        redis_cluster=target.cluster,
        member_id_base=f"bench-{tag}",
        middlewares=middlewares,
    )
    handled = 0
    first = 0.0
    first_cpu = 0.0
    expected = 0  # set once the streams are final
    done = anyio.Event()
    modulus = round(100 / failing_percent) if failing_percent else 0

    def failing(entry_id: bytes) -> bool:
        return bool(modulus) and zlib.crc32(entry_id) % modulus == 0

    @app.stream_listener(
        stream_prefix=prefix,
        group=group,
        concurrency=concurrency,
        batch_size=batch,
        ordered=ordered,
        failure_policy=FailurePolicy(max_attempts=3, backoff_initial_ms=50),
        idempotent=idempotent,
    )
    async def handle(msg: Message) -> None:
        nonlocal handled, first, first_cpu
        if not handled:
            first = time.perf_counter()
            first_cpu = time.process_time()
        if failing(msg.raw_id):
            raise RuntimeError("failing on purpose")
        handled += 1
        if handled == expected:
            done.set()
        await msg.ack()

    members = {f"bench-{tag}-m{i}" for i in range(concurrency)}
    # Counted before the clock can start: scanning the streams is no free lunch.
    poison = await count_failing(redis, prefix, shards, failing) if modulus else 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(app.serve)
        while True:  # joined and balanced
            current = await owners(coordinator, prefix, group)
            counts = [len(current.get(m, [])) for m in members]
            if set(current) == members and sum(counts) == shards and max(counts) - min(counts) <= 1:
                break
            await anyio.sleep(0.05)
        for shard in range(shards):
            await redis.xgroup_setid(f"{prefix}:{shard}", group, "0")
        # SETID does not wake readers blocked in XREADGROUP; one new entry per
        # shard does (and is counted).
        for shard in range(shards):
            poison += failing(await redis.xadd(f"{prefix}:{shard}", {"payload": PAYLOAD}))
        total = sum([await redis.xlen(f"{prefix}:{shard}") for shard in range(shards)])
        expected = total - poison
        with anyio.fail_after(300):
            await done.wait()
        elapsed = time.perf_counter() - first
        if cpu is not None:
            cpu.append((time.process_time() - first_cpu) / max(handled - 1, 1) * 1e6)
        dlq = dead_letter_key(prefix, group)
        with anyio.fail_after(60):  # the failing ones end up dead-lettered
            while poison and await redis.xlen(dlq) < poison:  # noqa: ASYNC110 - Redis state
                await anyio.sleep(0.05)
        app.shutdown()
    pending = 0
    for shard in range(shards):
        for info in await redis.xinfo_groups(f"{prefix}:{shard}"):
            if info["name"] == group.encode():
                pending += info["pending"]
    if pending:
        details = []
        for shard in range(shards):
            details += await redis.xpending_range(f"{prefix}:{shard}", group, "-", "+", 10)
        raise RuntimeError(f"{pending} entries left pending: {details} handled={handled}")
    return expected / elapsed


async def count_failing(redis: Any, prefix: str, shards: int, failing: Any) -> int:
    count = 0
    for shard in range(shards):
        cursor = "-"
        while True:
            entries = await redis.xrange(f"{prefix}:{shard}", cursor, "+", count=10_000)
            count += sum(1 for entry_id, _ in entries if failing(entry_id))
            if len(entries) < 10_000:
                break
            cursor = "(" + entries[-1][0].decode()
    return count


async def failure_runs(
    args: argparse.Namespace,
    coordinator: CoordinatorProcess,
    target: RedisTarget,
    redis: Any,
    prefix: str,
) -> None:
    concurrency = max(args.concurrency)
    print(f"\nhandler failures: {args.failing_percent}% failing, concurrency={concurrency}")
    print(f"{'run':<40}{'healthy msg/s':>14}{'vs healthy':>12}")
    for ordered in (False, True):
        mode = "ordered" if ordered else "unordered"
        ratios = []
        for attempt in range(args.repeat):
            tag = f"{mode[0]}{attempt}"
            run = (coordinator, target, redis, prefix, args.shards, args.batch, concurrency)
            healthy = await streamkit_run(*run, f"h{tag}", ordered=ordered)
            mixed = await streamkit_run(
                *run, f"f{tag}", ordered=ordered, failing_percent=args.failing_percent
            )
            ratios.append(mixed / healthy)
            print(f"{f'{mode}, all healthy':<40}{healthy:>14,.0f}")
            print(f"{f'{mode}, {args.failing_percent}% failing':<40}{mixed:>14,.0f}"
                  f"{mixed / healthy:>12.0%}")  # fmt: skip
        if args.repeat > 1:
            print(f"median healthy-throughput ratio, {mode}: {statistics.median(ratios):.0%}")


def observability_stacks() -> dict[str, list[Middleware]]:
    """Off, and the built-in metrics + tracing middlewares without and with an OTel SDK."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased
    from prometheus_client import CollectorRegistry

    from streamkit.observability.metrics import PrometheusMiddleware
    from streamkit.observability.tracing import TracingMiddleware

    # Every entry carries a traceparent of a producer sampling 1 % (see
    # prepublish). No exporter: exporting is the app's own cost.
    # Every entry recorded: a sampler that says yes to all, asked every time.
    sdk = TracerProvider(sampler=ALWAYS_ON)
    # What a high-volume pipeline runs: the producer samples 1 % at the head,
    # the consumer follows its decision (the SDK's default ParentBased).
    sampled = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))
    # A consumer that samples on its own, ignoring the producer's flag: the
    # SDK is asked (and creates a sampled-out span) for every entry.
    own = TracerProvider(sampler=TraceIdRatioBased(0.01))
    return {
        "middlewares off": [],
        # Tracing's own cost, apart from the metrics: the same SDK set-ups
        # without PrometheusMiddleware, against "off".
        "metrics only": [PrometheusMiddleware(CollectorRegistry())],
        "tracing only (SDK, 1% at producer)": [
            TracingMiddleware(tracer=sampled.get_tracer("streamkit"))
        ],
        "tracing only (SDK, all spans)": [
            TracingMiddleware(tracer=sdk.get_tracer("streamkit"), follow_parent_sampling=False)
        ],
        "metrics + tracing (API only)": [
            PrometheusMiddleware(CollectorRegistry()),
            TracingMiddleware(),
        ],
        "metrics + tracing (SDK, all spans)": [
            PrometheusMiddleware(CollectorRegistry()),
            TracingMiddleware(tracer=sdk.get_tracer("streamkit"), follow_parent_sampling=False),
        ],
        "metrics + tracing (SDK, 1% at producer)": [
            PrometheusMiddleware(CollectorRegistry()),
            TracingMiddleware(tracer=sampled.get_tracer("streamkit")),
        ],
        "metrics + tracing (SDK, 1% own sampler)": [
            PrometheusMiddleware(CollectorRegistry()),
            TracingMiddleware(tracer=own.get_tracer("streamkit"), follow_parent_sampling=False),
        ],
    }


async def observability_runs(
    args: argparse.Namespace, coordinator: CoordinatorProcess, target: RedisTarget, redis: Any,
    prefix: str,
) -> None:  # fmt: skip
    print(f"\nbuilt-in middlewares, concurrency=1, {args.repeat} run(s) each, median")
    print(f"{'run':<40}{'msg/s':>12}{'CPU µs/entry':>14}")
    ratios: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    figures: dict[str, list[float]] = {}
    for attempt in range(args.repeat):
        stacks = [
            (name, stack)
            for name, stack in observability_stacks().items()
            if not stack or not args.stacks or any(word in name for word in args.stacks)
        ]
        # Rotate which stack goes first: a run's neighbours on the shared
        # machine differ, so no stack always gets the same slot.
        shift = attempt % len(stacks)
        for index, (name, stack) in enumerate(stacks[shift:] + stacks[:shift]):
            tag = f"obs{index}x{attempt}"
            rate = await streamkit_run(
                coordinator, target, redis, prefix, args.shards, args.batch, 1, tag,
                middlewares=stack, cpu=cpu.setdefault(name, []),
            )  # fmt: skip
            figures.setdefault(name, []).append(rate)
            print(f"  round {attempt + 1}: {name:<34}{rate:>12,.0f}{cpu[name][-1]:>14.1f}",
                  flush=True)  # fmt: skip
        # The ratio within one round: the load of the shared machine moves
        # between rounds more than between neighbouring runs.
        for name, values in figures.items():
            ratios.setdefault(name, []).append(values[-1] / figures["middlewares off"][-1])
    print("median of the rounds: msg/s, its ratio to off in the same round, and the")
    print("client's CPU time per entry with its ratio to off (the steadier measure)")
    off_cpu = statistics.median(cpu["middlewares off"])
    for name, values in figures.items():
        rate, ratio = statistics.median(values), statistics.median(ratios[name])
        per_entry = statistics.median(cpu[name])
        print(f"{name:<40}{rate:>12,.0f}{ratio:>8.0%}{per_entry:>10.1f} µs"
              f"{off_cpu / per_entry:>8.0%}")  # fmt: skip


async def command_calls(redis: Any) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def paced_idle_publish(redis: Any, prefix: str, shards: int, seconds: float) -> int:
    """One entry per second per shard, spread evenly (one every 1/shards s)."""
    total = int(shards * seconds)
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / shards - time.perf_counter()
        if delay > 0:
            await anyio.sleep(delay)
        await redis.xadd(f"{prefix}:{i % shards}", {"payload": PAYLOAD})
    return total


def per_entry(before: dict[str, int], after: dict[str, int], entries: int) -> dict[str, float]:
    delta = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    others = sum(
        n for name, n in delta.items() if name not in ("xreadgroup", "xack", "xadd", "info")
    )
    return {
        "xreadgroup": delta.get("xreadgroup", 0) / entries,
        "xack": delta.get("xack", 0) / entries,
        "other": others / entries,
    }


async def idle_streamkit(
    coordinator: CoordinatorProcess, target: RedisTarget, redis: Any, args: argparse.Namespace
) -> dict[str, float]:
    prefix, group = "idle-sk", "idle"
    shards = args.idle_shards
    await create_group(coordinator, prefix, group, shards)
    user, password = coordinator.admin_auth
    app = StreamKit(
        coordinator_url=coordinator.url,
        coordinator_username=user,
        coordinator_password=password,
        redis_url=target.url,
        member_id_base="bench-idle",
    )
    handled = 0

    @app.stream_listener(stream_prefix=prefix, group=group)
    async def handle(msg: Message) -> None:
        nonlocal handled
        handled += 1
        await msg.ack()

    async with anyio.create_task_group() as tg:
        tg.start_soon(app.serve)
        while True:  # joined: the one member holds every shard
            current = await owners(coordinator, prefix, group)
            if len(current.get("bench-idle-m0", [])) == shards:
                break
            await anyio.sleep(0.05)
        await anyio.sleep(1.0)  # every shard in its blocking read
        before = await command_calls(redis)
        total = await paced_idle_publish(redis, prefix, shards, args.idle_seconds)
        with anyio.fail_after(60):
            while handled < total or not await idle_acked(redis, prefix, group, shards):  # noqa: ASYNC110 - Redis state
                await anyio.sleep(0.05)
        after = await command_calls(redis)
        app.shutdown()
    return per_entry(before, after, total)


async def idle_acked(redis: Any, prefix: str, group: str, shards: int) -> bool:
    for shard in range(shards):
        for info in await redis.xinfo_groups(f"{prefix}:{shard}"):
            if info["name"] == group.encode() and (info["pending"] or info["lag"]):
                return False
    return True


async def idle_raw(redis: Any, url: str, args: argparse.Namespace) -> dict[str, float]:
    prefix, group, shards = "idle-raw", "idle", args.idle_shards
    for shard in range(shards):
        await redis.xgroup_create(f"{prefix}:{shard}", group, "$", mkstream=True)
    # One connection per blocked reader, as the raw loop would need anyway.
    consumer: Any = redis_client(RedisTarget(url=url, cluster=False))
    handled = 0

    async def one_shard(key: str) -> None:
        nonlocal handled
        while True:
            reply = await consumer.xreadgroup(group, "raw", {key: ">"}, count=100, block=2000)
            if reply:
                entries = reply[0][1]
                handled += len(entries)
                await consumer.xack(key, group, *[entry_id for entry_id, _ in entries])

    async with anyio.create_task_group() as tg:
        for shard in range(shards):
            tg.start_soon(one_shard, f"{prefix}:{shard}")
        await anyio.sleep(1.0)
        before = await command_calls(redis)
        total = await paced_idle_publish(redis, prefix, shards, args.idle_seconds)
        with anyio.fail_after(60):
            while handled < total or not await idle_acked(redis, prefix, group, shards):  # noqa: ASYNC110 - Redis state
                await anyio.sleep(0.05)
        after = await command_calls(redis)
        tg.cancel_scope.cancel()
    await consumer.aclose()
    return per_entry(before, after, total)


async def idle_runs(
    args: argparse.Namespace, coordinator: CoordinatorProcess, target: RedisTarget, redis: Any
) -> None:
    print(
        f"\nidle shards: {args.idle_shards} shards x 1 entry/s for {args.idle_seconds:g} s; "
        "Redis commands per handled entry (INFO commandstats deltas)"
    )
    print(f"{'run':<28}{'XREADGROUP':>12}{'XACK':>8}{'other':>8}{'total':>8}")
    kit = await idle_streamkit(coordinator, target, redis, args)
    raw = await idle_raw(redis, target.url, args)
    for name, figures in (("raw XREADGROUP BLOCK+XACK", raw), ("streamkit", kit)):
        print(
            f"{name:<28}{figures['xreadgroup']:>12.2f}{figures['xack']:>8.2f}"
            f"{figures['other']:>8.2f}{sum(figures.values()):>8.2f}"
        )


async def bench(args: argparse.Namespace, url: str, coordinator: CoordinatorProcess) -> None:
    target = RedisTarget(url=url, cluster=False)
    redis = redis_client(target)
    prefix = "bench"
    if args.idle_only:
        await idle_runs(args, coordinator, target, redis)
        await redis.aclose()
        return
    await create_group(coordinator, prefix, "provision", args.shards)
    started = time.perf_counter()
    await prepublish(redis, prefix, args.shards, args.messages, traced=args.observability)
    print(
        f"pre-published {args.messages} entries over {args.shards} shards "
        f"in {time.perf_counter() - started:.1f}s"
    )
    if args.observability:
        await observability_runs(args, coordinator, target, redis, prefix)
        await redis.aclose()
        return
    print(f"{'run':<28}{'msg/s':>12}{'vs raw':>10}")
    ratios: dict[int, list[float]] = {c: [] for c in args.concurrency}
    for attempt in range(args.repeat):
        for concurrency in args.concurrency:
            tag = f"{concurrency}x{attempt}"
            raw = await raw_loop(redis, prefix, args.shards, args.batch, f"raw{tag}")
            kit = await streamkit_run(
                coordinator, target, redis, prefix, args.shards, args.batch, concurrency, tag
            )
            ratios[concurrency].append(kit / raw)
            print(f"{'raw XREADGROUP+XACK':<28}{raw:>12,.0f}")
            print(f"{f'streamkit concurrency={concurrency}':<28}{kit:>12,.0f}{kit / raw:>10.0%}")
    if args.repeat > 1:
        for concurrency, values in ratios.items():
            print(
                f"median streamkit/raw, concurrency={concurrency}: {statistics.median(values):.0%}"
            )
    if args.failing_percent:
        await failure_runs(args, coordinator, target, redis, prefix)
    if args.idle_shards:
        await idle_runs(args, coordinator, target, redis)
    await redis.aclose()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--failing-percent",
        type=float,
        default=1.0,
        help="share of entries whose handler fails, for the failure runs (0: skip them)",
    )
    parser.add_argument("--idle-shards", type=int, default=64, help="0: skip the idle case")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--idle-only", action="store_true", help="only the idle-shard case")
    parser.add_argument(
        "--observability",
        action="store_true",
        help="only compare the built-in metrics + tracing middlewares on vs off",
    )
    parser.add_argument(
        "--stacks",
        nargs="+",
        metavar="WORD",
        help="with --observability: only the stacks whose name contains one of these "
        "words (\"off\" always runs), e.g. --stacks 'API only' producer",
    )
    args = parser.parse_args(argv)
    # One warning (with traceback) per failed attempt would flood the output.
    logging.getLogger("streamkit.poller").setLevel(logging.CRITICAL)
    with RedisServer() as server, bench_coordinator(server.url) as coordinator:
        print(f"redis {server.url}, coordinator {coordinator.url}, pid {os.getpid()}, "
              f"reply parser: {REPLY_PARSER}")  # fmt: skip
        anyio.run(bench, args, server.url, coordinator)


if __name__ == "__main__":
    main()
