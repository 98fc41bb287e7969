"""Publish -> handler latency at a paced rate: streamkit against a raw redis-py loop.

Run: python bench/latency.py                 (1,000 and 10,000 msg/s, 10 s each)
     python bench/latency.py --rates 1000 --seconds 20 --rounds 2
     python bench/latency.py --rates 1000 --interleave 0.5   (sides take turns)
     python bench/latency.py --rates 1000 --paired   (both sides at once)

One private ``redis-server`` and coordinator (via ``streamkit.testing``). The
same paced publisher feeds both sides, one after the other, in the same
process and event loop:

* raw: one stream, one task doing ``XREADGROUP COUNT 100 BLOCK 2000`` then one
  ``XACK`` of what it read (the hand-written single-stream consumer);
* streamkit: an in-process ``StreamKit`` app, ``--concurrency`` members over
  ``--shards`` shard streams, default listener options, the handler records
  the latency then ``await msg.ack()``.

The publisher wakes every millisecond and sends every entry due by then
(``rate`` per second, evenly spread) with a plain ``XADD`` (several due
entries: one pipeline), stamping each with the ``perf_counter_ns`` taken right
before the send. The handler's latency is ``perf_counter_ns`` at its call
minus that stamp, so it includes the publish round trip, the wait in Redis and
the consumer's read. Both sides use the same publisher and client, so the
ratio isolates the consumer. The first ``--warmup`` seconds are not counted.

By default the two sides run one after the other. This VM has bursts of
steal time lasting seconds, so a round can put one side in a burst and the
other in a calm spell. Two modes spread the disturbances over both sides:

* ``--interleave SECONDS``: both sides are open for the whole run and the
  publisher feeds them in turns (raw for SECONDS, then streamkit, ...), so
  each side gets half of every stretch of the run while only one of them
  reads at a time;
* ``--paired``: one publisher sends each entry to both sides at once (one
  pipeline, one stamp), so both see the same arrivals and disturbances; the
  two consumers then share the event loop, each paying for the other's work.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
from consume import REPLY_PARSER, bench_coordinator, create_group, owners

from streamkit import Message, StreamKit
from streamkit.testing import RedisServer, RedisTarget, redis_client
from streamkit.testing.coordinator import CoordinatorProcess

PAYLOAD = "x" * 80


def percentile(sorted_values: list[float], p: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(p / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


async def paced_publish(
    redis: Any,
    targets: list[tuple[list[str], Recorder]],
    rate: int,
    seconds: float,
    interleave: float | None = None,
) -> None:
    """Publish ``rate`` entries per second for ``seconds``: each entry to every
    target (its keys in turn), or with ``interleave`` to one target at a time,
    switching every ``interleave`` seconds of the schedule. Each recorder
    learns how many entries it will get."""
    total = int(rate * seconds)
    start = time.perf_counter()
    sent = 0
    counts = [0] * len(targets)
    while sent < total:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        if due > sent:
            stamp = str(time.perf_counter_ns())
            sends: list[str] = []
            for i in range(sent, due):
                chosen = range(len(targets))
                if interleave:
                    side = int(i / rate / interleave) % len(targets)
                    chosen = range(side, side + 1)
                for t in chosen:
                    keys = targets[t][0]
                    sends.append(keys[counts[t] % len(keys)])
                    counts[t] += 1
            if len(sends) == 1:
                await redis.xadd(sends[0], {"t": stamp, "p": PAYLOAD})
            else:
                pipe = redis.pipeline(transaction=False)
                for key in sends:
                    pipe.xadd(key, {"t": stamp, "p": PAYLOAD})
                await pipe.execute()
            sent = due
        await anyio.sleep(0.001)
    for (_, recorder), count in zip(targets, counts, strict=True):
        recorder.expected[0] = count
        if recorder.count >= count:
            recorder.done.set()


async def all_handled(recorder: Recorder) -> None:
    # The last entry may have been handled before the publisher returned.
    if recorder.count < recorder.expected[0]:
        with anyio.fail_after(300):  # a saturated consumer catches up slowly
            await recorder.done.wait()


class Recorder:
    def __init__(self, warmup_ns: int) -> None:
        self.latencies: list[float] = []
        self.count = 0
        self.done = anyio.Event()
        self.expected = [0]
        self.start_ns = time.perf_counter_ns()
        self.warmup_ns = warmup_ns

    def start(self, warmup_s: float) -> None:
        """The clock starts now; the first ``warmup_s`` seconds are not counted."""
        self.start_ns = time.perf_counter_ns()
        self.warmup_ns = int(warmup_s * 1e9)

    def record(self, stamp: bytes) -> None:
        now = time.perf_counter_ns()
        sent = int(stamp)
        if sent - self.start_ns >= self.warmup_ns:
            self.latencies.append((now - sent) / 1e6)
        self.count += 1
        if self.expected[0] and self.count >= self.expected[0]:
            self.done.set()

    def summary(self) -> dict[str, float]:
        values = sorted(self.latencies)
        return {
            "p50": percentile(values, 50),
            "p99": percentile(values, 99),
            "p99.9": percentile(values, 99.9),
            "max": values[-1],
            "n": float(len(values)),
        }


#: A side of the comparison while it reads: the keys to publish to, its recorder.
Target = tuple[list[str], Recorder]


@asynccontextmanager
async def raw_consumer(redis: Any, tag: str, args: argparse.Namespace) -> AsyncIterator[Target]:
    """The hand-written single-stream loop, reading; yields its key and recorder."""
    key, group = f"raw-{tag}", "raw"
    await redis.xgroup_create(key, group, "$", mkstream=True)
    consumer: Any = redis_client(RedisTarget(url=args.url, cluster=False))
    recorder = Recorder(0)

    async def consume() -> None:
        while True:
            reply = await consumer.xreadgroup(group, "raw", {key: ">"}, count=100, block=2000)
            if not reply:
                continue
            entries = reply[0][1]
            for _, fields in entries:
                recorder.record(fields[b"t"])
            await consumer.xack(key, group, *[entry_id for entry_id, _ in entries])

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.sleep(0.2)  # the first read is blocking
        yield [key], recorder
        tg.cancel_scope.cancel()
    await consumer.aclose()
    await redis.delete(key)


@asynccontextmanager
async def streamkit_consumer(
    coordinator: CoordinatorProcess, tag: str, args: argparse.Namespace
) -> AsyncIterator[Target]:
    """An in-process app, joined and balanced; yields its shard keys and recorder."""
    prefix, group = f"sk-{tag}", "lat"
    await create_group(coordinator, prefix, group, args.shards)
    user, password = coordinator.admin_auth
    app = StreamKit(
        coordinator_url=coordinator.url,
        coordinator_username=user,
        coordinator_password=password,
        redis_url=args.url,
        member_id_base=f"lat-{tag}",
    )
    recorder = Recorder(0)

    @app.stream_listener(stream_prefix=prefix, group=group, concurrency=args.concurrency)
    async def handle(msg: Message) -> None:
        recorder.record(msg.raw_fields[b"t"])
        await msg.ack()

    members = {f"lat-{tag}-m{i}" for i in range(args.concurrency)}
    async with anyio.create_task_group() as tg:
        # As `streamkit run` does (STREAMKIT_GC_FREEZE): full collections skip the start-up heap.
        tg.start_soon(functools.partial(app.serve, freeze_heap=True))
        while True:  # joined and balanced before the clock starts
            current = await owners(coordinator, prefix, group)
            counts = [len(current.get(m, [])) for m in members]
            if set(current) == members and sum(counts) == args.shards:
                if max(counts) - min(counts) <= 1:
                    break
            await anyio.sleep(0.05)
        await anyio.sleep(0.5)  # every shard in its blocking read
        yield [f"{prefix}:{shard}" for shard in range(args.shards)], recorder
        app.shutdown()


async def measure(
    redis: Any,
    sides: list[AbstractAsyncContextManager[Target]],
    rate: int,
    args: argparse.Namespace,
) -> list[dict[str, float]]:
    """Open the sides, feed them all from one paced publisher, wait until every
    entry was handled; their latency summaries in the order given."""
    async with AsyncExitStack() as stack:
        targets = [await stack.enter_async_context(side) for side in sides]
        for _, recorder in targets:
            recorder.start(args.warmup)
        await paced_publish(redis, targets, rate, args.seconds, args.interleave)
        for _, recorder in targets:
            await all_handled(recorder)
    return [recorder.summary() for _, recorder in targets]


async def bench(args: argparse.Namespace, coordinator: CoordinatorProcess) -> None:
    redis = redis_client(RedisTarget(url=args.url, cluster=False))
    if args.interleave:
        mode = f"interleaved: the sides take turns every {args.interleave:g} s"
    elif args.paired:
        mode = "paired: both sides fed at once"
    else:
        mode = "one side after the other"
    print(
        f"{args.shards} shards, concurrency {args.concurrency}, {args.seconds:g} s per run "
        f"(first {args.warmup:g} s not counted), {mode}; latencies in ms"
    )
    header = f"{'run':<20}{'p50':>10}{'p99':>10}{'p99.9':>10}{'max':>10}{'n':>8}"
    for round_ in range(args.rounds):
        for rate in args.rates:
            print(f"\nround {round_ + 1}, {rate:,} msg/s\n{header}")
            tag = f"{rate}-{round_}"
            raw = raw_consumer(redis, tag, args)
            kit = streamkit_consumer(coordinator, tag, args)
            results: dict[str, dict[str, float]] = {}
            if args.paired or args.interleave:
                # One publisher feeds both sides in the same stretch of time,
                # so the machine's disturbances (this VM has bursts of steal
                # time lasting seconds) fall on both alike.
                results["raw"], results["streamkit"] = await measure(redis, [raw, kit], rate, args)
            else:
                # Alternate which side goes first, so drift in the machine's load
                # does not always favour the same one.
                order = [("raw", raw), ("streamkit", kit)]
                for name, side in order if round_ % 2 == 0 else order[::-1]:
                    (results[name],) = await measure(redis, [side], rate, args)
            for side_name in ("raw", "streamkit"):
                r = results[side_name]
                print(
                    f"{side_name:<20}{r['p50']:>10.2f}{r['p99']:>10.2f}{r['p99.9']:>10.2f}"
                    f"{r['max']:>10.2f}{int(r['n']):>8}"
                )
            raw_r, kit_r = results["raw"], results["streamkit"]
            print(
                f"{'streamkit / raw':<20}{kit_r['p50'] / raw_r['p50']:>9.2f}x"
                f"{kit_r['p99'] / raw_r['p99']:>9.2f}x{kit_r['p99.9'] / raw_r['p99.9']:>9.2f}x"
                f"{kit_r['max'] / raw_r['max']:>9.2f}x",
                flush=True,
            )
    await redis.aclose()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--paired",
        action="store_true",
        help="feed both sides at once from one publisher (the same disturbances hit both)",
    )
    parser.add_argument(
        "--interleave",
        type=float,
        metavar="SECONDS",
        help="both sides open, fed in turns of SECONDS each (only one side reads at a time)",
    )
    args = parser.parse_args(argv)
    # A loaded machine makes heartbeats late and the lease cuts reads short;
    # that shows in the figures, one warning per cut read would bury them.
    logging.getLogger("streamkit.poller").setLevel(logging.ERROR)
    with RedisServer() as server, bench_coordinator(server.url) as coordinator:
        args.url = server.url
        print(f"redis {server.url}, coordinator {coordinator.url}, pid {os.getpid()}, "
              f"reply parser: {REPLY_PARSER}")  # fmt: skip
        anyio.run(bench, args, coordinator)


if __name__ == "__main__":
    main()
