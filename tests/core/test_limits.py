"""Bounds on what a client may ask for: the pure join check."""

from __future__ import annotations

import dataclasses

import pytest

from streamkit_server.core import handle_heartbeat, join_refusal, new_group
from streamkit_server.core.errors import Rejected
from streamkit_server.core.limits import evictable_records

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


def test_departed_member_records_make_room_for_joins_oldest_first() -> None:
    # Restarts give every process a new member id: churn alone must never
    # lock live processes out (4 records per slot with 2 slots: cap 8).
    h = Harness(group=new_group("s", "g", 1, 0), config=LIMITED)
    for i in range(8):
        member = f"m{i}"
        h.beat(member, request(member, 0))
        h.advance(1)
        h.beat(member, request(member, -1))
    assert len(h.group.members) == 8 and not h.group.live_member_ids()
    assert join_refusal(h.group, "new", request("new", 0), LIMITED) is None
    h.beat("new", request("new", 0))
    assert "new" in h.group.live_member_ids()
    assert len(h.group.members) == 8 and "m0" not in h.group.members  # the oldest went


def test_records_that_may_still_read_are_never_evicted() -> None:
    # "a" owns both shards and, told to give one up, keeps heartbeating
    # without revoking: past the rebalance timeout it is fenced and holds
    # its shards one more lease (it may be reading).  Its record must stay
    # however many joins need room.
    h = Harness(group=new_group("s", "g", 2, 0), config=LIMITED)
    first = h.steady("a", h.join("a"))
    assert first.assigned == [0, 1]
    h.join("b")
    step = LIMITED.member_lease_ttl_ms // 3
    for _ in range(LIMITED.rebalance_timeout_ms // step + 2):
        h.advance(step)
        for member in ("a", "b"):
            stored = h.group.members[member]
            if stored.live:
                owned = [0, 1] if member == "a" else []  # "a" never revokes
                version = h.group.metadata_version
                h.beat(member, request(member, stored.member_epoch, owned=owned, version=version))
    assert h.group.members["a"].state.value == "FENCED" and h.group.shards_held_by("a")
    for i in range(6):  # churn fills the other records
        member = f"c{i}"
        h.join(member)
        h.beat(member, request(member, -1))
    assert "a" not in evictable_records(h.group)
    for i in range(6, 12):  # joins past the cap evict churn, never "a"
        h.join(f"c{i}")
        h.beat(f"c{i}", request(f"c{i}", -1))
        assert "a" in h.group.members and len(h.group.members) <= 8


def test_join_refused_only_when_no_departed_record_can_go() -> None:
    h = Harness(group=new_group("s", "g", 1, 0), config=LIMITED)
    for member in ("a", "b"):
        h.beat(member, request(member, 0))
    refusal = join_refusal(h.group, "c", request("c", 0), LIMITED)
    assert refusal is not None and "2 live members" in refusal


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
