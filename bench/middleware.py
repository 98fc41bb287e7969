"""The built-in consume middlewares' own CPU cost per entry, without Redis.

Run: python bench/middleware.py [--entries 50000] [--rounds 5] [--batch 100]
                                [--stacks WORD ...]

``bench/consume.py --observability`` measures the same middlewares end to end,
where a round's throughput moves by 20 % with the machine; this isolates what
the chain itself adds. Each stack runs over the same entries the way the
poller runs it (reads of ``--batch`` entries: the ``consume_read`` levels
once per read, the ``consume`` levels once per entry, a handler that returns
its result at once), in one event loop, the stacks interleaved round by
round; the figure is the process CPU time per entry (median of the rounds)
and its difference to no middleware at all.

Entries carry a ``traceparent`` as a publisher sampling 1 % at the head writes
it (1 in 100 flagged sampled). The stacks are ``bench/consume.py``'s
(``observability_stacks``: off; metrics + tracing without an SDK; with an SDK
recording every entry, sampling 1 % at the producer (followed, the default),
or sampling 1 % on its own), plus ``PrometheusMiddleware`` alone.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from functools import partial

from consume import head_sampled_traceparent, observability_stacks
from prometheus_client import CollectorRegistry

from streamkit.consumer.invoke import Invoker
from streamkit.consumer.message import Message
from streamkit.consumer.options import PollerOptions
from streamkit.middleware import (
    Chain,
    ConsumeResult,
    Middleware,
    ReadContext,
)
from streamkit.observability.metrics import PrometheusMiddleware


class _Sink:
    """The shard session a message names; the handler does not settle."""

    stream_key = "bench:3"
    consumer_group = "group"
    member_id = "member-1"

    def settle(self, raw_id: bytes, how: object) -> None:
        pass


def stacks(words: list[str] | None = None) -> dict[str, list[Middleware]]:
    """``bench/consume.py``'s observability stacks, plus metrics alone; with
    ``words``, only those whose name contains one of them (and off)."""
    built = observability_stacks()
    off = built.pop("middlewares off")
    every: dict[str, list[Middleware]] = {
        "off": off,
        "metrics": [PrometheusMiddleware(CollectorRegistry())],
        **built,
    }
    return {
        name: stack
        for name, stack in every.items()
        if not stack or not words or any(word in name for word in words)
    }


def entries(n: int) -> list[Message]:
    rng = random.Random(1)
    sink = _Sink()
    out = []
    for i in range(n):
        parent = head_sampled_traceparent(i, rng)
        fields = {b"payload": b"x" * 84, b"traceparent": parent.encode()}
        out.append(Message(sink, 3, b"1-%d" % i, fields))
    return out


async def run(stack: list[Middleware], messages: list[Message], batch: int) -> float:
    """The poller's use of the middlewares: the dispatcher's ``consume_read``
    levels per read, and the real ``Invoker`` per entry (its ``consume``
    levels and inline ``enter_consume``/``exit_consume`` hooks)."""

    async def handler(message: Message) -> None:
        pass

    invoker = Invoker(
        stream_prefix="bench", consumer_group="group", member_id="member-1",
        options=PollerOptions(), handler=handler, batch_handler=None, middlewares=stack,
    )  # fmt: skip

    async def handle_read(
        chunk: list[Message], results: list[ConsumeResult] | None
    ) -> list[ConsumeResult]:
        for message in chunk:
            result = await invoker.invoke(message)
            if results is not None:
                results.append(result)
        return results if results is not None else []

    started = time.process_time()
    for index in range(0, len(messages), batch):
        chunk = messages[index : index + batch]
        read_levels = invoker.begin_read()
        if read_levels:
            ctx = ReadContext(chunk, "bench", "group", "member-1")
            await Chain.run(read_levels, ctx, partial(handle_read, chunk, []))
        else:
            await handle_read(chunk, None)
    return (time.process_time() - started) / len(messages) * 1e6


async def main(args: argparse.Namespace) -> None:
    messages = entries(args.entries)
    built = stacks(args.stacks)
    cpu: dict[str, list[float]] = {name: [] for name in built}
    for round_ in range(args.rounds):
        names = list(built)
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            cpu[name].append(await run(built[name], messages, args.batch))
    off = statistics.median(cpu["off"])
    print(
        f"{args.entries:,} entries in reads of {args.batch}, {args.rounds} rounds;"
        " CPU µs per entry (median)"
    )
    print(f"{'stack':<42}{'µs/entry':>10}{'added':>10}")
    for name, values in cpu.items():
        median = statistics.median(values)
        print(f"{name:<42}{median:>10.2f}{median - off:>10.2f}")
    print(
        "\n'added' is what the chain costs per entry on top of the handler call;"
        "\ncompare it with the CPU a handled entry costs end to end"
        " (bench/consume.py --observability: ~7.5 µs with hiredis on this machine)."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=100, help="entries per read")
    parser.add_argument(
        "--stacks",
        nargs="+",
        help="only the stacks whose name contains one of these words (off always runs), "
        "e.g. --stacks '1% at producer'",
    )
    asyncio.run(main(parser.parse_args()))
