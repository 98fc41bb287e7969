"""Cost of the retention janitor per shard per pass, against a plain XTRIM in the same run.

    python bench/retention.py [shards=8] [entries per pass=500] [groups=3] [rounds=24]

A private redis-server, ``shards`` shard streams of one stream, each with
``groups`` consumer groups.  Each round writes ``entries per pass`` entries
to every shard, lets every group read them all and acknowledge all but the
newest 10 (so ``XPENDING`` has work), then times one janitor call
(``RETAIN``: ``XINFO GROUPS``, ``XPENDING`` per group with pending entries,
the length cut, ``XTRIM MINID``) per shard, with a length policy that trims
exactly what the round added.  The baseline, on the same server and the same
data in alternate rounds, is what a retention that ignores the groups would
send: one plain ``XTRIM MINID = <the same cut>`` per shard (the id computed
outside the timing: ``XTRIM MAXLEN = n`` for the length policy, ``XTRIM
MINID`` for an age policy.  Also timed: a pass with nothing to trim (the
steady state between writes).  Each row shows the wall time (round trip
included, which dominates on a busy machine) and Redis' own time for the
command (``INFO commandstats``), each as a ratio to its baseline.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from streamkit.routing import stream_key
from streamkit.testing import RedisServer, RedisTarget, redis_client
from streamkit_server.coordination.retention import Trimmer
from streamkit_server.core.retention import RetentionPolicy

KEEP = 2_000


async def _fill(
    client: object, keys: list[str], groups: list[str], per_pass: int, held: dict[str, list[str]]
) -> None:
    """Write a round, read it with every group, ack all but the newest 10 of each group."""
    c = client  # redis.asyncio.Redis
    for key in keys:
        pipe = c.pipeline(transaction=False)  # type: ignore[attr-defined]
        for n in range(per_pass):
            pipe.xadd(key, {"n": n, "payload": "x" * 64})
        await pipe.execute()
        for group in groups:
            got = await c.xreadgroup(group, "c", {key: ">"}, count=per_pass)  # type: ignore[attr-defined]
            ids = held.get(key + group, []) + [i for _, entries in got for i, _ in entries]
            await c.xack(key, group, *ids[:-10])  # type: ignore[attr-defined]
            held[key + group] = ids[-10:]


async def run(shards: int, per_pass: int, group_count: int, rounds: int) -> None:
    with RedisServer() as server:
        client = redis_client(RedisTarget(server.url, False), decode_responses=True)
        keys = [stream_key("bench", s) for s in range(shards)]
        groups = [f"g{i}" for i in range(group_count)]
        for key in keys:
            for group in groups:
                await client.xgroup_create(key, group, id="0", mkstream=True)
        trimmer = Trimmer(client)
        policy = RetentionPolicy(max_length=KEEP)
        held: dict[str, list[str]] = {}
        # Start at the steady size: KEEP entries per shard, all read.
        for _ in range(KEEP // per_pass):
            await _fill(client, keys, groups, per_pass, held)
        # Each mode alternates rounds between RETAIN and its baseline.
        figures: dict[str, list[float]] = {name: [] for name in _ROWS}
        server: dict[str, list[float]] = {name: [] for name in _ROWS}
        trimmed = blocked = 0
        for r in range(rounds):
            round_start = int(time.time() * 1000)
            await asyncio.sleep(0.002)  # the round's ids are later than round_start
            await _fill(client, keys, groups, per_pass, held)
            age = RetentionPolicy(max_age_ms=max(1, int(time.time() * 1000) - round_start))
            # All length rounds first: an age round trims below the length policy.
            mode, by = ("length", policy) if r < rounds // 2 else ("age", age)
            if r % 2 == 0:
                for name in (f"RETAIN, {mode} policy", f"RETAIN, {mode} policy, nothing to trim"):
                    start, used = time.perf_counter(), await _server_us(client, "evalsha")
                    for shard in range(shards):
                        trim = await trimmer.trim("bench", shard, by, groups)
                        trimmed += trim.trimmed
                        blocked += trim.blocked
                    figures[name].append(_per_shard(start, shards))
                    used = await _server_us(client, "evalsha") - used
                    server[name].append(used / shards)
            else:
                name = f"plain XTRIM, {mode} (baseline)"
                start, used = time.perf_counter(), await _server_us(client, "xtrim")
                for key in keys:
                    if mode == "length":
                        trimmed += await client.xtrim(key, maxlen=KEEP, approximate=False)
                    else:
                        trimmed += await client.xtrim(key, minid=f"{round_start}-0")
                figures[name].append(_per_shard(start, shards))
                server[name].append((await _server_us(client, "xtrim") - used) / shards)
        lengths = {await client.xlen(k) for k in keys}
        await client.aclose()
    print(
        f"retention janitor: {shards} shards x {group_count} groups, {per_pass} entries "
        f"trimmed per shard per pass, median of {rounds // 4} passes per row; "
        f"shard lengths after: {sorted(lengths)}"
    )
    print(f"  {'per shard, median':42}{'wall (round trip)':>20}{'Redis CPU':>20}")
    for mode in ("length", "age"):
        base_name = f"plain XTRIM, {mode} (baseline)"
        base = statistics.median(figures[base_name])
        base_cpu = statistics.median(server[base_name])
        label = f"plain XTRIM {'MAXLEN' if mode == 'length' else 'MINID'} (baseline)"
        print(f"  {label:42}{base:10.0f} us        {base_cpu:10.0f} us")
        for name in (f"RETAIN, {mode} policy", f"RETAIN, {mode} policy, nothing to trim"):
            wall, cpu = statistics.median(figures[name]), statistics.median(server[name])
            print(f"  {name:42}{wall:10.0f} us {wall / base:5.2f}x {cpu:10.0f} us "
                  f"{cpu / base_cpu:5.2f}x")  # fmt: skip
    print(f"  entries trimmed in all: {trimmed}; RETAIN calls blocked: {blocked}")


_ROWS = [f"{what}, {mode}{tail}" for mode in ("length", "age")
         for what, tail in (("RETAIN", " policy"), ("RETAIN", " policy, nothing to trim"),
                            ("plain XTRIM", " (baseline)"))]  # fmt: skip


async def _server_us(client: object, command: str) -> float:
    """Redis' own time spent in ``command`` so far (INFO commandstats), in microseconds."""
    stats = await client.info("commandstats")  # type: ignore[attr-defined]
    return float(stats.get(f"cmdstat_{command}", {}).get("usec", 0))


def _per_shard(start: float, shards: int) -> float:
    return (time.perf_counter() - start) * 1e6 / shards


def main() -> None:
    args = [int(a) for a in sys.argv[1:5]]
    shards, per_pass, groups, rounds = [*args, *[8, 500, 3, 24][len(args) :]]
    asyncio.run(run(shards, per_pass, groups, rounds))


if __name__ == "__main__":
    main()
