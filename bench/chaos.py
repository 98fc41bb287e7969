"""Chaos soak: the delivery guarantees measured under real, combined faults.

Run: python bench/chaos.py                       (three seeds, 10 minutes each)
     python bench/chaos.py --seeds 7 --minutes 1  (one short run)
     python bench/chaos.py --cluster              (on a Redis Cluster, its own faults)

Each run starts, on loopback, a Redis primary with an asynchronous replica,
coordinator processes behind a load-balancing proxy, ``streamkit run``
consumers and a publisher process, then injects every fault type on a seeded
schedule (see tests/chaos/faults.py) and judges the run from the records the
processes wrote (tests/chaos/checks.py).  Prints one table row per run, as in
docs/reliability.md, and exits 1 if any run lost an entry, let two readers
hold a shard at once, read without a lease or broke per-key order.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from chaos.harness import HEADER, run  # noqa: E402


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of each run")
    parser.add_argument("--workdir", type=Path, default=None, help="keep records here")
    parser.add_argument(
        "--idempotent",
        action="store_true",
        help="idempotent publishes and listener; fails on any duplicate effect",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="on a Redis Cluster (3 primaries, 1 replica each) with its faults",
    )
    args = parser.parse_args()
    rows, failed = [], False
    for seed in (int(s) for s in args.seeds.split(",")):
        workdir = args.workdir / f"seed-{seed}" if args.workdir else None
        result = await run(
            seed=seed,
            duration=args.minutes * 60,
            workdir=workdir,
            idempotent=args.idempotent,
            cluster=args.cluster,
        )
        rows.append(result.row())
        print(result.details(), flush=True)
        print(f"{HEADER}\n{result.row()}", flush=True)
        failed |= not result.verdict.ok
        if args.idempotent:
            failed |= result.duplicate_effects > 0
            failed |= result.verdict.duplicates["publisher retry (two entries)"] > 0
    print("\nAll runs:\n" + HEADER + "\n" + "\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
