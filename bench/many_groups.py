"""The cost of many groups on one stream: creating them, scaling the stream, and
what one console tab asks for.

Run: python bench/many_groups.py                 (200 groups, about half a minute;
                                                   starts its own Redis and coordinator)
     python bench/many_groups.py --groups 1000   (the issue-36 probe's size)

Reported:

* creating ``--groups`` groups on one stream, ``--parallel`` requests at a
  time (default 1: creates on one stream take its lock in turn): total
  seconds, and one create's time in the first and the last tenth (a create
  reads the stream's other groups, so a cost that grows with the count
  shows here);
* ``POST /streams/{prefix}/scale`` from ``--shards`` to twice as many: the
  time to the 202 and to DEPRECATED (no members, so no drain waits);
* the console overview's requests per round and per 10 s for this many groups,
  as ``console.js`` schedules them (``overview_plan``; counted, not driven in
  a browser), with the same-run baseline of fetching every group every round.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio
import httpx

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess

API = "/coord/v1"
#: console.js: POLL_MS default, DETAIL_BATCH, per-group detail requests.
POLL_MS = 1000
DETAIL_BATCH = 25
PER_GROUP = 2


def overview_plan(groups: int, batch: int | None) -> tuple[int, float]:
    """(largest burst, requests per 10 s) of the overview for ``groups`` groups.

    ``batch`` None: every group's details every round, the round delayed to
    ``groups * 100`` ms (the console before issue 36).
    """
    fetched = groups if batch is None else min(groups, batch)
    per_round = 2 + PER_GROUP * fetched  # health + group list + details
    delay_ms = max(POLL_MS, fetched * 100)
    return per_round, per_round * 10_000 / delay_ms


async def _create(http: httpx.AsyncClient, prefix: str, n: int, parallel: int,
                  shards: int) -> list[float]:  # fmt: skip
    took = [0.0] * n
    limiter = anyio.Semaphore(parallel)

    async def one(i: int) -> None:
        async with limiter:
            started = time.perf_counter()
            while True:  # creates on one stream take its lock in turn: 503 BUSY, retry
                answer = await http.post(f"{API}/streams/{prefix}/groups/g{i:05d}",
                                         json={"initialShardCount": shards,
                                               "requestedBy": "bench"})  # fmt: skip
                if answer.status_code != 503:
                    break
            took[i] = time.perf_counter() - started
            if answer.status_code != 201:
                raise RuntimeError(answer.text)

    # The first group alone: it creates the stream.
    await one(0)
    async with anyio.create_task_group() as tg:
        for i in range(1, n):
            tg.start_soon(one, i)
    return took


async def _scale(http: httpx.AsyncClient, prefix: str, target: int) -> tuple[float, float]:
    started = time.perf_counter()
    answer = await http.post(f"{API}/streams/{prefix}/scale",
                             json={"targetShardCount": target, "requestedBy": "bench",
                                   "reason": "bench"})  # fmt: skip
    accepted = time.perf_counter() - started
    if answer.status_code != 202:
        raise RuntimeError(answer.text)
    while True:
        group: dict[str, Any] = (await http.get(f"{API}/streams/{prefix}/groups/g00000")).json()
        if not group.get("activeMigration"):
            return accepted, time.perf_counter() - started
        await anyio.sleep(0.05)


async def main(args: argparse.Namespace) -> None:
    with RedisServer() as redis:
        # The server's own timings (the tick walks every group each interval).
        coord = CoordinatorProcess(
            redis.url, startup_timeout=60, heartbeat_interval_ms=None,
            member_lease_ttl_ms=None, rebalance_timeout_ms=None, tick_interval_ms=None,
        )  # fmt: skip
        coord.start()
        try:
            async with httpx.AsyncClient(base_url=coord.url, auth=coord.admin_auth,
                                         timeout=120) as http:  # fmt: skip
                started = time.perf_counter()
                took = await _create(http, "many", args.groups, args.parallel, args.shards)
                total = time.perf_counter() - started
                tenth = max(1, args.groups // 10)
                first = sum(took[1 : tenth + 1]) / tenth * 1000
                last = sum(took[-tenth:]) / tenth * 1000
                print(f"create {args.groups} groups: {total:.1f} s "
                      f"({total / args.groups * 1000:.1f} ms/group wall); one create "
                      f"{first:.0f} ms (first tenth) -> {last:.0f} ms (last tenth)")  # fmt: skip
                accepted, done = await _scale(http, "many", args.shards * 2)
                print(f"scale {args.shards}->{args.shards * 2} with {args.groups} groups: "
                      f"202 after {accepted:.2f} s, DEPRECATED after {done:.2f} s")  # fmt: skip
        finally:
            coord.cleanup()
    burst, rate = overview_plan(args.groups, DETAIL_BATCH)
    old_burst, old_rate = overview_plan(args.groups, None)
    print(f"console overview, {args.groups} groups: burst {burst} requests, "
          f"{rate:.0f} per 10 s (baseline: burst {old_burst}, {old_rate:.0f} per 10 s; "
          f"burst ratio {burst / old_burst:.3f})")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--shards", type=int, default=4)
    anyio.run(main, parser.parse_args())
