"""Bounds on what a client may ask for: the pure join check."""

from __future__ import annotations

import dataclasses

import pytest

from streamkit_server.core import handle_heartbeat, join_refusal, new_group
from streamkit_server.core.errors import Rejected

from .harness import CONFIG, Harness, request

LIMITED = dataclasses.replace(CONFIG, max_members_per_group=2)


def test_join_beyond_the_live_member_bound_is_refused_and_retries_are_not() -> None:
    h = Harness(group=new_group("s", "g", 4, 0), config=LIMITED)
    for member in ("a", "b"):
        assert join_refusal(h.group, member, request(member, 0), LIMITED) is None
        h.beat(member, request(member, 0))
    group = h.group
    refusal = join_refusal(group, "c", request("c", 0), LIMITED)
    assert refusal is not None and "2 live members" in refusal and "at most 2" in refusal
    # A retried join of a live member and any non-join heartbeat add nobody.
    assert join_refusal(group, "a", request("a", 0), LIMITED) is None
    assert join_refusal(group, "c", request("c", 5), LIMITED) is None
    # Once a member leaves there is room again.
    h.advance(1)
    h.beat("b", request("b", -1))
    assert join_refusal(h.group, "c", request("c", 0), LIMITED) is None


def test_departed_member_records_are_bounded_too() -> None:
    h = Harness(group=new_group("s", "g", 1, 0), config=LIMITED)
    for i in range(8):  # 4 records per slot with 2 slots: the 9th new id is refused
        member = f"m{i}"
        h.beat(member, request(member, 0))
        h.beat(member, request(member, -1))
    assert len(h.group.members) == 8 and not h.group.live_member_ids()
    refusal = join_refusal(h.group, "new", request("new", 0), LIMITED)
    assert refusal is not None and "member records" in refusal
    # Retention expires them; then new members may join.
    h.advance(LIMITED.dead_member_retention_ms + 1)
    assert h.tick()
    assert join_refusal(h.group, "new", request("new", 0), LIMITED) is None


def test_handle_heartbeat_refuses_a_join_past_the_limit_and_changes_nothing() -> None:
    # The rule lives in the core: the simulation and the executor see it alike.
    h = Harness(group=new_group("s", "g", 4, 0), config=LIMITED)
    for member in ("a", "b"):
        h.beat(member, request(member, 0))
    before = h.group
    with pytest.raises(Rejected) as refused:
        handle_heartbeat(before, "c", request("c", 0), h.now, LIMITED)
    assert refused.value.error_code == "TOO_MANY_MEMBERS"
    assert "at most 2" in refused.value.message
    assert h.group == before
    # A retried join of a live member is answered as before.
    assert handle_heartbeat(before, "a", request("a", 0), h.now, LIMITED).response is not None
