"""Benchmark: round trips to Redis per 100 entries consumed, against a raw loop.

A raw ``XREADGROUP`` + ``XACK`` loop makes one round trip per batch: the acks
of a batch go in the same pipeline as the next read.  This consumes a
pre-published backlog (8 shards, batches of ``--batch``) with an in-process
app whose handler only acks, and counts what the member's shard readers send:

* ``reads``: ``XREADGROUP``s, counted by Redis (``INFO commandstats``; a
  short read costs a round trip for fewer entries);
* ``round trips``: pipelines the shard readers sent (reads, with or without
  acks or commits riding along), plus flushes of acks or commits on their
  own, counted in the process.

The count does not depend on how busy the machine is, unlike a rate, though
the mix can move a little with timing (a reader that waits long for tokens
sends its acks on their own).

Run: python bench/round_trips.py [--messages 40000] [--concurrency 1 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from consume import bench_coordinator, create_group, prepublish, streamkit_run

import streamkit.consumer.shard_io as shard_io
from streamkit.consumer.acks import AckQueue
from streamkit.testing import RedisServer, RedisTarget, redis_client

_sent = {"pipelines": 0, "flushes": 0}


def _count_round_trips() -> None:
    """Count the readers' pipelines and stand-alone flushes (the real calls run)."""
    send = shard_io.send_commands
    flush: Callable[..., Awaitable[None]] = AckQueue.flush

    async def counted_send(*args: Any, **kwargs: Any) -> Any:
        _sent["pipelines"] += 1
        return await send(*args, **kwargs)

    async def counted_flush(self: AckQueue, *, final: bool = False) -> None:
        if self.acks or self.dels or self.letters or self.commits:
            _sent["flushes"] += 1
        await flush(self, final=final)

    shard_io.send_commands = counted_send  # type: ignore[assignment]
    AckQueue.flush = counted_flush  # type: ignore[method-assign]


async def run(args: argparse.Namespace, target: RedisTarget, coordinator: Any) -> None:
    redis = redis_client(target)
    prefix = "bench"
    await create_group(coordinator, prefix, "provision", args.shards)
    await prepublish(redis, prefix, args.shards, args.messages)
    per_100 = 100 / args.messages
    print(f"raw XREADGROUP+XACK loop: {100 / args.batch:.2f} round trips per 100 entries")
    print(f"{'run':<34}{'reads':>8}{'round trips':>13}{'flushes':>9}   (per 100 entries)")
    for concurrency in args.concurrency:
        for idempotent in (False, True):
            await redis.config_resetstat()
            _sent.update(pipelines=0, flushes=0)
            tag = f"{concurrency}{'i' if idempotent else 'p'}"
            await streamkit_run(
                coordinator,
                target,
                redis,
                prefix,
                args.shards,
                args.batch,
                concurrency,
                tag,
                idempotent=idempotent,
            )
            stats = await redis.info("commandstats")
            # A script's inner XREADGROUP (an idempotent read) counts here too.
            reads = int(stats.get("cmdstat_xreadgroup", {}).get("calls", 0))
            trips = _sent["pipelines"] + _sent["flushes"]
            name = f"concurrency={concurrency} {'idempotent' if idempotent else 'plain'}"
            print(
                f"{name:<34}{reads * per_100:>8.2f}{trips * per_100:>13.2f}"
                f"{_sent['flushes'] * per_100:>9.2f}"
            )
    await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    _count_round_trips()
    with RedisServer() as server, bench_coordinator(server.url) as coordinator:
        asyncio.run(run(args, RedisTarget(url=server.url, cluster=False), coordinator))


if __name__ == "__main__":
    main()
