"""Bounds on what a client may ask for: the pure join check."""

from __future__ import annotations

import dataclasses

from streamkit_server.core import GroupMetadata, handle_heartbeat, join_refusal, new_group, tick

from .harness import CONFIG, request

LIMITED = dataclasses.replace(CONFIG, max_members_per_group=2)


def beat(group: GroupMetadata, member: str, epoch: int, now: int = 0) -> GroupMetadata:
    state = handle_heartbeat(group, member, request(member, epoch), now, LIMITED).state
    assert state is not None
    return state


def test_join_beyond_the_live_member_bound_is_refused_and_retries_are_not() -> None:
    group = new_group("s", "g", 4, 0)
    for member in ("a", "b"):
        assert join_refusal(group, member, request(member, 0), LIMITED) is None
        group = beat(group, member, 0, 0)
    refusal = join_refusal(group, "c", request("c", 0), LIMITED)
    assert refusal is not None and "2 live members" in refusal and "at most 2" in refusal
    # A retried join of a live member and any non-join heartbeat add nobody.
    assert join_refusal(group, "a", request("a", 0), LIMITED) is None
    assert join_refusal(group, "c", request("c", 5), LIMITED) is None
    # Once a member leaves there is room again.
    group = beat(group, "b", -1, 1)
    assert join_refusal(group, "c", request("c", 0), LIMITED) is None


def test_departed_member_records_are_bounded_too() -> None:
    group = new_group("s", "g", 1, 0)
    now = 0
    for i in range(8):  # 4 records per slot with 2 slots: the 9th new id is refused
        member = f"m{i}"
        group = beat(group, member, 0, now)
        group = beat(group, member, -1, now)
    assert len(group.members) == 8 and not group.live_member_ids()
    refusal = join_refusal(group, "new", request("new", 0), LIMITED)
    assert refusal is not None and "member records" in refusal
    # Retention expires them; then new members may join.
    group = tick(group, now + LIMITED.dead_member_retention_ms + 1, LIMITED)
    assert join_refusal(group, "new", request("new", 0), LIMITED) is None
