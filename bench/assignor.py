"""Target assignment cost: from scratch and when one member joins.

    python bench/assignor.py [members] [shards]

Prints the median of several runs and the shards moved next to the minimum
(the newcomer's fair share), and, as the baseline measured in the same run, a
bare pass that only builds a dict of the same size (the floor for any assignor
that returns a fresh shard -> member map).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from streamkit_server.core import assign, moved_count


def median_ms(fn: Callable[[], object], runs: int = 15) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    members = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000
    shards = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    ids = [f"member-{i:05d}" for i in range(members)]
    shard_range = range(shards)

    baseline = median_ms(lambda: {s: ids[s % members] for s in shard_range})
    scratch = median_ms(lambda: assign(shard_range, ids, {}))
    balanced = assign(shard_range, ids, {})
    joined = [*ids, "member-new"]
    incremental = median_ms(lambda: assign(shard_range, joined, balanced))
    after = assign(shard_range, joined, balanced)
    moved = moved_count(balanced, after)
    minimum = sum(1 for m in after.values() if m == "member-new")

    print(f"assignor: {members} members x {shards} shards (median of 15 runs)")
    print(f"  baseline dict build      {baseline:8.2f} ms")
    print(f"  from scratch             {scratch:8.2f} ms  ({scratch / baseline:.1f}x baseline)")
    ratio = incremental / baseline
    print(f"  one member joins         {incremental:8.2f} ms  ({ratio:.1f}x baseline)")
    print(f"  shards moved             {moved} (minimum {minimum})")


if __name__ == "__main__":
    main()
