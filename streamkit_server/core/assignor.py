"""Sticky, balanced target assignment.

Given the shards, the live members and the previous target, keep every shard
where it is unless its member is gone or holds more than its fair share, then
hand the rest to the least-loaded members.  The result is balanced (max - min
shards per member <= 1) and moves the fewest shards that balance allows:
members already holding the most get the ``base + 1`` quotas, so only true
excess is taken away.
"""

from __future__ import annotations

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
        result.update(dict.fromkeys(mine[:cap], member))
        free.extend(mine[cap:])
        del mine[cap:]

    # Every member ends exactly at its quota (the quotas add up to the shard
    # count), so the free shards are dealt out in one pass: the emptiest
    # members first, each taking what it lacks.  No heap: 100,000 shards over
    # 10,000 members stay a few list slices.
    free.sort()
    position = 0
    for member in sorted(member_list, key=lambda m: (len(kept[m]), m)):
        need = quota[member] - len(kept[member])
        if need > 0:
            result.update(dict.fromkeys(free[position : position + need], member))
            position += need
    return result


def moved_count(before: Mapping[int, str], after: Mapping[int, str]) -> int:
    """Shards whose target changed from one member to another."""
    return sum(1 for shard, member in after.items() if before.get(shard, member) != member)
