"""The chaos soak: real processes, seeded faults, verdict from the records.

The 60-second run is part of the default test command; the long runs
(``-m long``) are what docs/reliability.md reports.  See harness.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .cluster_faults import CLUSTER_KINDS
from .faults import KINDS
from .harness import HEADER, Result, run

pytestmark = pytest.mark.slow

CI_SEED = 18


def _check(result: Result) -> None:
    print(f"\n{HEADER}\n{result.row()}\n{result.details()}")
    verdict = result.verdict
    assert not verdict.lost, result.details()
    assert not verdict.overlaps, result.details()
    assert not verdict.reads_without_lease, result.details()
    assert not verdict.order_violations, result.details()
    assert verdict.handled == verdict.published - sum(verdict.dropped_by_redis.values())
    # Every fault was healed and the group caught up before the run ended.
    assert verdict.last_reconvergence_s != float("inf"), result.details()
    # Redis at maxmemory: the coordinator answered, or failed closed with a code.
    for answer in result.oom.answers:
        assert answer in ("200", "503 REDIS_OUT_OF_MEMORY") or answer.startswith(
            ("no answer", "no coordinator", "503 ")
        ), result.details()


async def test_sixty_seconds_of_every_fault(tmp_path: Path) -> None:
    result = await run(seed=CI_SEED, duration=60.0, workdir=tmp_path, repeat=False)
    assert result.faults == dict.fromkeys(KINDS, 1), result.faults
    assert not result.skipped, result.notes
    _check(result)
    # The publisher met the full Redis, and every refused seq went out later.
    assert all(w.refused > 0 for w in result.oom.windows), result.details()
    assert result.verdict.refused > 0, result.details()
    assert result.verdict.refused_never_published == 0, result.details()


@pytest.mark.cluster
async def test_sixty_seconds_on_a_cluster(tmp_path: Path) -> None:
    """Redis Cluster (3 primaries, a replica each): every cluster fault (primary
    SIGKILL, CLUSTER FAILOVER, slot migration of a shard and of the metadata,
    node paused past cluster-node-timeout) and every client fault once."""
    result = await run(seed=CI_SEED, duration=60.0, workdir=tmp_path, repeat=False, cluster=True)
    assert result.faults == dict.fromkeys(CLUSTER_KINDS, 1), result.faults
    assert not result.skipped, result.notes
    _check(result)


async def test_sixty_seconds_idempotent(tmp_path: Path) -> None:
    """The idempotent mode: every fault once, 0 duplicate effects, 0 second
    entries from publisher retries (entries Redis itself lost excepted)."""
    result = await run(seed=CI_SEED, duration=60.0, workdir=tmp_path, repeat=False, idempotent=True)
    assert result.faults == dict.fromkeys(KINDS, 1), result.faults
    _check(result)
    _check_idempotent(result)


def _check_idempotent(result: Result) -> None:
    assert result.effects is not None
    assert result.duplicate_effects == 0, result.details()
    assert result.verdict.duplicates["publisher retry (two entries)"] == 0, result.details()
    # (Effects of handled seqs can be missing: a Redis restart without
    # persistence wipes them with everything else; only excess counts.)


LONG_SEEDS = [int(s) for s in os.environ.get("CHAOS_SEEDS", "1,2,3").split(",")]


@pytest.mark.long
@pytest.mark.parametrize("seed", LONG_SEEDS)
async def test_long_soak(seed: int, tmp_path: Path) -> None:
    minutes = float(os.environ.get("CHAOS_MINUTES", "10"))
    idempotent = os.environ.get("CHAOS_IDEMPOTENT") == "1"
    cluster = os.environ.get("CHAOS_CLUSTER") == "1"
    result = await run(
        seed=seed,
        duration=minutes * 60,
        workdir=tmp_path,
        idempotent=idempotent,
        cluster=cluster,
    )
    _check(result)
    if idempotent:
        _check_idempotent(result)
