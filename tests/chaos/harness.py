"""One chaos run: set up, load, inject the seeded faults, drain, judge.

``run(seed=..., duration=...)`` returns a :class:`Result` whose ``verdict``
comes from the records alone (see ``checks.py``); ``bench/chaos.py`` and
``tests/chaos/test_chaos.py`` print its table row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamkit.scripts import slot_key
from streamkit.testing.coordinator import TEST_ADMIN_PASSWORD, TEST_ADMIN_USERNAME

from . import checks
from .cluster import ClusterTopology
from .cluster_faults import CLUSTER_KINDS, ClusterChaos
from .faults import KINDS, Chaos, schedule
from .oom import OomLog
from .topology import Topology, direct

log = logging.getLogger("chaos")

WARMUP_S = 4.0
#: No fault starts in the last QUIET_S seconds of a run: the group must
#: reconverge and catch up inside it.
QUIET_S = 12.0
DRAIN_S = 45.0


@dataclass
class Result:
    seed: int
    duration_s: float
    faults: Counter[str]
    verdict: checks.Verdict
    workdir: Path
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    #: Idempotent mode: seq -> how often its staged effect was applied (None: plain mode).
    effects: dict[int, int] | None = None
    oom: OomLog = field(default_factory=OomLog)
    #: Entries handled, and reads sent, while a Redis refused writes (redis-oom).
    handled_in_oom: int = 0
    reads_in_oom: int = 0

    @property
    def duplicate_effects(self) -> int:
        return sum(n - 1 for n in (self.effects or {}).values() if n > 1)

    def row(self) -> str:
        v = self.verdict
        done = self.faults - Counter(self.skipped)
        faults = ", ".join(
            f"{k} {n}" + (f" ({v.refused} publishes refused)" if k == "redis-oom" else "")
            for k, n in sorted(done.items())
        )
        dropped = ", ".join(f"{k} {n}" for k, n in sorted(v.dropped_by_redis.items())) or "0"
        dups = sum(v.duplicates.values())
        return (
            f"| {self.seed} | {self.duration_s:.0f} s | {faults} | {v.published} | {v.handled} "
            f"| {len(v.lost)} | {dropped} | {dups} | {len(v.overlaps)} "
            f"| {len(v.order_violations)} | {v.max_reconvergence_s:.1f} s "
            f"| {v.last_reconvergence_s:.1f} s |"
        )

    def details(self) -> str:
        v = self.verdict
        lines = [f"seed {self.seed}: {'PASS' if v.ok else 'FAIL'} (records in {self.workdir})"]
        lines.append(
            "  duplicates: "
            + (", ".join(f"{reason} {n}" for reason, n in v.duplicates.most_common()) or "none")
        )
        lines.append(f"  reads ending after their lease (paused processes): {v.late_ends}")
        if self.effects is not None:
            lines.append(
                f"  idempotent mode: {len(self.effects)} seqs with an effect, "
                f"{self.duplicate_effects} duplicate effects"
            )
        if self.oom.windows:
            lines.append(
                f"  redis-oom: {len(self.oom.windows)} windows, "
                f"{sum(w.end_ns - w.start_ns for w in self.oom.windows) / 1e9:.1f} s in all, "
                f"{sum(w.refused for w in self.oom.windows)} commands refused by Redis; "
                f"{v.refused} publish attempts refused ({v.refused_seqs} seqs, "
                f"{v.refused_never_published} never published); "
                f"while refusing: {self.handled_in_oom} entries handled, "
                f"{self.reads_in_oom} reads sent; coordinator probe: "
                + (", ".join(f"{a} {n}" for a, n in self.oom.answers.most_common()) or "none")
            )
        if v.lost:
            lines.append(f"  LOST seqs: {v.lost[:30]}")
        for a, b in v.overlaps[:10]:
            lines.append(f"  OVERLAP shard {a.shard}: {a} / {b}")
        for r in v.reads_without_lease[:10]:
            lines.append(f"  READ WITHOUT LEASE: {r}")
        for h, top in v.order_violations[:10]:
            lines.append(f"  ORDER: {h} after seq {top}")
        return "\n".join(lines)


HEADER = (
    "| seed | duration | faults | published | handled | lost | dropped by Redis "
    "| duplicates | overlaps | order violations | max reconvergence | after last fault |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


async def run(
    *,
    seed: int,
    duration: float,
    workdir: Path | None = None,
    shards: int = 8,
    consumers: int = 3,
    rate: float = 40.0,
    repeat: bool = True,
    idempotent: bool = False,
    cluster: bool = False,
) -> Result:
    """One run; ``repeat=False`` injects every fault kind exactly once;
    ``idempotent``: idempotent publishes and listener, effects counted;
    ``cluster``: on a Redis Cluster, with its faults (cluster_faults.py)."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"streamkit-chaos-{seed}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    prefix, group = f"chaos{seed}", "soak"
    client_env = {
        "STREAMKIT_COORDINATOR_USERNAME": TEST_ADMIN_USERNAME,
        "STREAMKIT_COORDINATOR_PASSWORD": TEST_ADMIN_PASSWORD,
        "STREAMKIT_COORDINATOR_TIMEOUT": "2.0",
        "STREAMKIT_REDIS_SOCKET_TIMEOUT": "3.0",
        "STREAMKIT_REDIS_CONNECT_TIMEOUT": "2.0",
        "SKC_PREFIX": prefix,
        "SKC_GROUP": group,
        "SKC_IDEMPOTENT": "1" if idempotent else "0",
    }
    top = (ClusterTopology if cluster else Topology)(
        workdir,
        prefix=prefix,
        group=group,
        shards=shards,
        consumer_env=client_env,
        publisher_env=client_env,
    )
    chaos = (ClusterChaos if cluster else Chaos)(top, rng)
    kinds = CLUSTER_KINDS if cluster else KINDS
    plan = schedule(rng, WARMUP_S, duration - QUIET_S, repeat=repeat, kinds=kinds)
    try:
        await top.start_redis()
        await top.start_coordinator()
        env = {"STREAMKIT_COORDINATOR_URL": top.lb.url, "STREAMKIT_REDIS_URL": top.redis_url}
        top.consumer_env.update(env)
        top.publisher_env.update(env)
        top.publisher_env.update(
            {
                "SKC_RECORD": str(workdir / "publisher.rec"),
                "SKC_RATE": str(rate),
                "STREAMKIT_ROUTING_REFRESH_INTERVAL": "0.5",
                "STREAMKIT_ROUTING_LEASE": "3.0",
            }
        )
        await top.create_group()
        for _ in range(consumers):
            top.start_consumer()
        top.start_publisher()
        began = time.monotonic()
        tasks: list[asyncio.Task[None]] = []
        for at, kind in plan:
            await asyncio.sleep(max(0.0, began + at - time.monotonic()))
            tasks.append(asyncio.ensure_future(chaos.run(kind)))
        await asyncio.gather(*tasks)
        await asyncio.sleep(max(0.0, began + duration - time.monotonic()))
        await top.stop_publisher()
        await _drain(top, chaos)
        await asyncio.gather(*(top.stop_consumer(p) for p in list(top.consumers)))
        end_ns = time.monotonic_ns()
        records = checks.parse(workdir / "publisher.rec", top.record_files, top.died_ns, end_ns)
        verdict = checks.judge(records, chaos.losses, chaos.spans)
        (workdir / "notes.log").write_text("\n".join(chaos.notes) + "\n")
        windows = [(w.start_ns, w.end_ns) for w in chaos.oom.windows]

        def in_oom(t: int) -> bool:
            return any(a <= t <= b for a, b in windows)

        return Result(
            seed,
            time.monotonic() - began,
            Counter(k for _, k in plan),
            verdict,
            workdir,
            chaos.notes,
            chaos.skipped,
            await _effects(top) if idempotent else None,
            chaos.oom,
            sum(1 for h in records.handled if in_oom(h.t1)),
            sum(1 for r in records.reads if in_oom(r.start_ns)),
        )
    finally:
        with contextlib.suppress(Exception):
            await top.close()


async def _effects(top: Topology) -> dict[int, int]:
    """seq -> times its effect was applied, summed over the shards' counters
    (on a cluster, read from whichever primary owns each shard's slot now)."""
    client: Any
    if isinstance(top, ClusterTopology):
        client = top.client()
    else:
        assert top.primary is not None
        client = direct(top.primary)
    try:
        applied: Counter[int] = Counter()
        for shard in range(top.shards):
            counts = await client.hgetall(slot_key(f"{top.prefix}:{shard}", "applied"))
            for seq, n in counts.items():
                applied[int(seq)] += int(n)
        return dict(applied)
    finally:
        await client.aclose()


async def _drain(top: Topology, chaos: Chaos) -> None:
    """Wait until every published entry that Redis still holds was handled."""
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline:
        records = checks.parse(
            top.workdir / "publisher.rec", top.record_files, top.died_ns, time.monotonic_ns()
        )
        verdict = checks.judge(records, chaos.losses, [])
        if not verdict.lost:
            return
        await asyncio.sleep(0.5)
