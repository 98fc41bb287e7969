"""Sticky, balanced target assignment.

Given the shards, the live members and the previous target, keep every shard
where it is unless its member is gone or holds more than its fair share, then
hand the rest to the least-loaded members.  The result is balanced (max - min
shards per member <= 1) and moves the fewest shards that balance allows:
members already holding the most get the ``base + 1`` quotas, so only true
excess is taken away.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping


def assign(
    shards: Iterable[int], members: Iterable[str], previous: Mapping[int, str]
) -> dict[int, str]:
    shard_list = sorted(set(shards))
    member_list = sorted(set(members))
    if not member_list:
        return {}
    base, extra = divmod(len(shard_list), len(member_list))

    kept: dict[str, list[int]] = {m: [] for m in member_list}
    free: list[int] = []
    for shard in shard_list:
        owner = previous.get(shard)
        if owner is not None and owner in kept:
            kept[owner].append(shard)
        else:
            free.append(shard)

    # The members keeping the most shards get the larger quotas; ties broken by
    # id so the result does not depend on dict order.
    by_load = sorted(member_list, key=lambda m: (-len(kept[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_load)}

    result: dict[int, str] = {}
    for member in member_list:
        mine = kept[member]
        cap = quota[member]
        for shard in mine[:cap]:
            result[shard] = member
        free.extend(mine[cap:])
        del mine[cap:]

    free.sort()
    # Fill the emptiest members first so a newcomer is brought up to its quota
    # before anyone else gets more.
    heap = [(len(kept[m]), m) for m in member_list if len(kept[m]) < quota[m]]
    heapq.heapify(heap)
    for shard in free:
        load, member = heapq.heappop(heap)
        result[shard] = member
        if load + 1 < quota[member]:
            heapq.heappush(heap, (load + 1, member))
    return result


def moved_count(before: Mapping[int, str], after: Mapping[int, str]) -> int:
    """Shards whose target changed from one member to another."""
    return sum(1 for shard, member in after.items() if before.get(shard, member) != member)
