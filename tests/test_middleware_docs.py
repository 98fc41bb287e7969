"""docs/middleware.md cannot drift: its metrics table is the registry's metric set
(both ways, with types and labels), and its idempotency guard example runs
against a real Redis."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from streamkit import StreamKit
from streamkit.consumer.message import Message, Settlement
from streamkit.middleware import ConsumeContext, ConsumeResult
from streamkit.observability.metrics import AppCollector, PrometheusMiddleware
from streamkit.testing import RedisServer, redis_client
from streamkit.testing import RedisTarget as Target

DOC = Path(__file__).resolve().parents[1] / "docs" / "middleware.md"
_ROW = re.compile(r"^\| `(streamkit_[a-z_]+)` \| (\w+) \| ([^|]+) \|", re.M)


def documented() -> dict[str, tuple[str, set[str]]]:
    text = DOC.read_text().split("<!-- metrics-table -->", 1)[1]
    return {
        name: (kind, set(re.findall(r"`(\w+)`", labels)))
        for name, kind, labels in _ROW.findall(text)
    }


def registered() -> dict[str, tuple[str, set[str]]]:
    registry = CollectorRegistry()
    middleware = PrometheusMiddleware(registry)
    registry.register(AppCollector(StreamKit()))
    out: dict[str, tuple[str, set[str]]] = {}
    for family in [*middleware.describe(), *AppCollector(StreamKit()).describe()]:
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = (family.type, set(family._labelnames))
    # Every name the registry would expose is covered by the loop above.
    exposed = {f.name for f in registry.collect()}
    assert {n.removesuffix("_total") for n in out} == exposed
    return out


def test_metrics_table_matches_the_registry() -> None:
    assert documented() == registered()


def test_every_metric_has_the_streamkit_prefix_and_bounded_labels() -> None:
    for name, (_, labels) in registered().items():
        assert name.startswith("streamkit_")
        assert labels <= {"stream_prefix", "group", "outcome", "reason", "member", "state"}, name


@dataclass
class Sink:
    stream_key: str = "orders:0"
    consumer_group: str = "billing"
    member_id: str = "m-1"
    settled: list[tuple[bytes, Settlement]] = field(default_factory=list)

    def settle(self, message_id: bytes, how: Settlement) -> None:
        self.settled.append((message_id, how))


async def test_idempotency_guard_example_runs(redis_server: RedisServer) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    (source,) = [b for b in blocks if "class IdempotencyGuard" in b]
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOC), "exec"), namespace)
    redis = redis_client(Target(url=redis_server.url, cluster=False))
    try:
        guard = namespace["IdempotencyGuard"](redis, ttl_s=60)
        await redis.delete("done:billing:orders:0:7-0")
        calls: list[str] = []

        async def handler(fail: bool) -> ConsumeResult:
            calls.append("handler")
            if fail:
                from streamkit.consumer.failure import FailurePolicy

                return ConsumeResult(FailurePolicy().decide(1, RuntimeError("x")))
            return ConsumeResult()

        def ctx(sink: Sink) -> ConsumeContext:
            return ConsumeContext(Message(sink, 0, b"7-0", {b"n": b"1"}), "orders", "billing", "m")

        first = Sink()
        failed = await guard.consume(ctx(first), lambda: handler(True))
        assert failed.failed and calls == ["handler"]
        again = await guard.consume(ctx(Sink()), lambda: handler(False))  # a retry still runs
        assert not again.failed and calls == ["handler", "handler"]
        repeat = Sink()
        skipped = await guard.consume(ctx(repeat), lambda: handler(False))
        assert calls == ["handler", "handler"]  # the repeat skipped the handler
        assert not skipped.failed and repeat.settled == [(b"7-0", Settlement.ACK)]
    finally:
        await redis.aclose()


DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "streamkit-client.json"
_SUFFIXES = ("_bucket", "_count", "_sum")


def _queries(node: Any) -> Iterator[str]:
    """Every PromQL string of a dashboard: panel targets and variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "query") and isinstance(value, str):
                yield value
            else:
                yield from _queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _queries(item)


def test_grafana_dashboard_names_only_existing_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = registered()
    # Histograms and summaries are queried by their _bucket/_count/_sum series.
    histograms = {n for n, (kind, _) in known.items() if kind in ("histogram", "summary")}
    used: set[str] = set()
    for query in _queries(dashboard):
        for name in re.findall(r"\bstreamkit_[a-z_]+", query):
            base = next((name[: -len(s)] for s in _SUFFIXES if name.endswith(s)), name)
            assert name in known or base in histograms, f"{name} in {query!r}"
            used.add(base if base in histograms else name)
    assert len(used) >= 8 and dashboard["panels"], used  # it shows the client, not one metric
