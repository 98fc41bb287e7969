"""The built-in consume middlewares' own CPU cost per entry, without Redis.

Run: python bench/middleware.py [--entries 50000] [--rounds 5]

``bench/consume.py --observability`` measures the same middlewares end to end,
where a round's throughput moves by 20 % with the machine; this isolates what
the chain itself adds. Each stack runs ``streamkit.middleware.chain`` over
the same entries (a handler that returns at once), in one event loop, the
stacks interleaved round by round; the figure is the process CPU time per
entry (median of the rounds) and its difference to no middleware at all.

Entries carry a ``traceparent`` as a publisher sampling 1 % at the head writes
it (1 in 100 flagged sampled). Stacks, as in ``bench/consume.py``:

* off: no middleware (the handler call alone);
* metrics: ``PrometheusMiddleware``;
* metrics + tracing, API only: no SDK installed (tracing inactive);
* metrics + tracing, SDK, 1 % at producer: ``ParentBased(TraceIdRatioBased(0.01))``,
  the consumer follows the entry's flag (the default);
* metrics + tracing, SDK, own 1 % sampler: ``follow_parent_sampling=False``,
  the SDK asked (and a sampled-out span created) for every entry;
* metrics + tracing, SDK, every entry recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased
from prometheus_client import CollectorRegistry

from streamkit.consumer.message import Message
from streamkit.middleware import ConsumeContext, ConsumeResult, Middleware, chain
from streamkit.observability.metrics import PrometheusMiddleware
from streamkit.observability.tracing import TracingMiddleware

DONE = ConsumeResult()


class _Sink:
    """The shard session a message names; the handler does not settle."""

    stream_key = "bench:3"
    consumer_group = "group"
    member_id = "member-1"

    def settle(self, raw_id: bytes, how: object) -> None:
        pass


def stacks() -> dict[str, list[Middleware]]:
    def tracing(provider: TracerProvider, follow: bool = True) -> list[Middleware]:
        return [
            PrometheusMiddleware(CollectorRegistry()),
            TracingMiddleware(tracer=provider.get_tracer("bench"), follow_parent_sampling=follow),
        ]

    return {
        "off": [],
        "metrics": [PrometheusMiddleware(CollectorRegistry())],
        "metrics + tracing, API only": [
            PrometheusMiddleware(CollectorRegistry()),
            TracingMiddleware(),
        ],
        "metrics + tracing, SDK 1% at producer": tracing(
            TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))
        ),
        "metrics + tracing, SDK own 1% sampler": tracing(
            TracerProvider(sampler=TraceIdRatioBased(0.01)), follow=False
        ),
        "metrics + tracing, SDK every entry": tracing(
            TracerProvider(sampler=ALWAYS_ON), follow=False
        ),
    }


def entries(n: int) -> list[Message]:
    rng = random.Random(1)
    sink = _Sink()
    out = []
    for i in range(n):
        flags = "01" if i % 100 == 0 else "00"
        parent = f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64) | 1:016x}-{flags}"
        fields = {b"payload": b"x" * 84, b"traceparent": parent.encode()}
        out.append(Message(sink, 3, b"1-%d" % i, fields))
    return out


async def run(stack: list[Middleware], messages: list[Message]) -> float:
    async def handler() -> ConsumeResult:
        return DONE

    started = time.process_time()
    for message in messages:
        if stack:
            ctx = ConsumeContext(message, "bench", "group", "member-1")
            await chain(stack, "consume", ctx, handler)
        else:
            await handler()
    return (time.process_time() - started) / len(messages) * 1e6


async def main(args: argparse.Namespace) -> None:
    messages = entries(args.entries)
    built = stacks()
    cpu: dict[str, list[float]] = {name: [] for name in built}
    for round_ in range(args.rounds):
        names = list(built)
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            cpu[name].append(await run(built[name], messages))
    off = statistics.median(cpu["off"])
    print(f"{args.entries:,} entries, {args.rounds} rounds; CPU µs per entry (median)")
    print(f"{'stack':<42}{'µs/entry':>10}{'added':>10}")
    for name, values in cpu.items():
        median = statistics.median(values)
        print(f"{name:<42}{median:>10.2f}{median - off:>10.2f}")
    print(
        "\n'added' is what the chain costs per entry on top of the handler call;"
        "\ncompare it with the CPU a handled entry costs end to end"
        " (bench/consume.py --observability: ~40-50 µs on this machine)."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
