"""Benchmark: what idempotency costs, against the plain path in the same run.

* consume: the same pre-published backlog consumed by an in-process app
  whose handler only acks, once with a plain listener (``XACK`` riding with
  the next read) and once with ``idempotent=True`` (a marker check per read,
  then one script of marker + ``XACK`` for the read's entries, riding with
  the next read), alternating, ``--repeat`` times; the ratio is time per entry.
* memory: ``MEMORY USAGE`` of a shard's marker set after ``--memory-ids``
  commits, and of a shard's publish dedup record after as many idempotent
  publishes, per id (ids of ~30 bytes, as a producer id + sequence or an
  order id would be).

The publish cost is measured by ``bench/publish.py`` (its idempotent modes).

Run: python bench/idempotent.py [--messages 20000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from consume import bench_coordinator, create_group, prepublish, streamkit_run

from streamkit.consumer.idempotence import Commit, Idempotence
from streamkit.consumer.shard_io import ShardIO
from streamkit.publisher.idempotence import PublishIdempotence
from streamkit.scripts import IDEMPOTENT_XADD, slot_key
from streamkit.testing import RedisServer, RedisTarget, redis_client


async def consume(args: argparse.Namespace, target: RedisTarget, coordinator: object) -> None:
    redis = redis_client(target)
    prefix = "bench"
    await create_group(coordinator, prefix, "provision", args.shards)  # type: ignore[arg-type]
    await prepublish(redis, prefix, args.shards, args.messages)
    rates: dict[bool, list[float]] = {False: [], True: []}
    # CPU per entry, the consumer's and Redis': what a loaded machine does not
    # inflate the way it stretches wall-clock time (the ratio to read there).
    cpus: dict[bool, list[float]] = {False: [], True: []}
    for attempt in range(args.repeat):
        for idempotent in (False, True) if attempt % 2 == 0 else (True, False):
            tag = f"{'idem' if idempotent else 'plain'}{attempt}"
            client_cpu: list[float] = []
            if args.stats:
                await redis.config_resetstat()
            before = await _redis_cpu_s(redis)
            rate = await streamkit_run(
                coordinator,  # type: ignore[arg-type]
                target,
                redis,
                prefix,
                args.shards,
                args.batch,
                1,
                tag,
                idempotent=idempotent,
                cpu=client_cpu,
            )
            server_us = (await _redis_cpu_s(redis) - before) * 1e6 / (args.messages)
            rates[idempotent].append(rate)
            if args.stats:
                print("   ", await _calls_per_read(redis, args.messages))
            cpus[idempotent].append(client_cpu[0] + server_us)
            print(
                f"  {'idempotent' if idempotent else 'plain':<12}{rate:>10,.0f} entries/s"
                f"   CPU {client_cpu[0]:5.1f} µs consumer + {server_us:5.1f} µs Redis per entry"
            )
    plain, idem = max(rates[False]), max(rates[True])
    print(f"\nconsume, best of {args.repeat}: plain {plain:,.0f}/s, idempotent {idem:,.0f}/s")
    print(f"  idempotent / plain, time per entry = {plain / idem:.2f}x")
    print(
        f"  medians: {statistics.median(rates[False]):,.0f}/s vs "
        f"{statistics.median(rates[True]):,.0f}/s"
    )
    plain_cpu, idem_cpu = statistics.median(cpus[False]), statistics.median(cpus[True])
    print(
        f"  CPU per entry (consumer + Redis), medians: plain {plain_cpu:.1f} µs, "
        f"idempotent {idem_cpu:.1f} µs = {idem_cpu / plain_cpu:.2f}x"
    )
    await redis.aclose()


async def _calls_per_read(redis: object, entries: int) -> str:
    """Commands Redis ran in the run, per 100 entries, and their time per entry."""
    stats = await redis.info("commandstats")  # type: ignore[attr-defined]
    return ", ".join(
        f"{name[8:]} {s['calls'] * 100 / entries:.1f}/100 {s['usec'] / entries:.2f} µs"
        for name, s in sorted(stats.items())
        if s["calls"] * 100 >= entries and name[8:] not in ("info", "config|resetstat")
    )


async def _redis_cpu_s(redis: object) -> float:
    """Redis' CPU seconds so far (user + system)."""
    info = await redis.info("cpu")  # type: ignore[attr-defined]
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def memory(args: argparse.Namespace, target: RedisTarget) -> None:
    redis = redis_client(target)
    n = args.memory_ids
    stream = "mem:0"
    await redis.xgroup_create(stream, "g", id="0", mkstream=True)
    io = ShardIO(
        redis,
        stream_key=stream,
        consumer_group="g",
        member_id="m",
        xackdel=False,
        dead_letter_key="mem:dlq",
        dead_letter_maxlen=10,
    )
    token = await io.take_fence()
    idempotence = Idempotence()
    for lo in range(0, n, 1000):
        commits = [Commit(b"0-1", f"{'p' * 16}:{i:012d}".encode()) for i in range(lo, lo + 1000)]
        await io.commit(commits, token, idempotence)
    markers = int(await redis.memory_usage(io.marker_key, samples=0) or 0)
    publish = PublishIdempotence(max_ids=n, producer_id="p" * 16)
    await redis.script_load(IDEMPOTENT_XADD.source)
    for lo in range(0, n, 1000):
        pipe = redis.pipeline(transaction=False)
        for _ in range(lo, lo + 1000):
            pipe.execute_command(
                *publish.command(stream, publish.next_id(), 0, ["f", "v"], auto=True)
            )
        await pipe.execute()
    dedup = sum(
        [
            int(await redis.memory_usage(slot_key(stream, part), samples=0) or 0)
            for part in ("idem", "idem:order")
        ]
    )
    print(f"\nmemory, {n:,} ids of ~30 bytes on one shard:")
    print(
        f"  marker set (per group):   {markers / n:6.1f} bytes per id ({markers / 2**20:.1f} MiB)"
    )
    print(f"  publish dedup record:     {dedup / n:6.1f} bytes per id ({dedup / 2**20:.1f} MiB)")
    await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--memory-ids", type=int, default=100_000)
    parser.add_argument(
        "--stats", action="store_true", help="print the commands Redis ran per 100 entries"
    )
    args = parser.parse_args()
    with RedisServer() as server, bench_coordinator(server.url) as coordinator:
        target = RedisTarget(url=server.url, cluster=False)
        asyncio.run(memory(args, target))
        asyncio.run(consume(args, target, coordinator))


if __name__ == "__main__":
    main()
