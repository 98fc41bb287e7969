"""Member identity: incarnations keep two processes with one member id apart.

Every test drives the pure core; the rules are those of issue "safety envelope":
a join under another incarnation is refused while the holder may read, a
heartbeat or leave under another incarnation changes nothing, and a static
leave (-2) keeps the member's shards reserved until its lease ends.
"""

from __future__ import annotations

import pytest

from streamkit.protocol import HeartbeatStatus, MemberState
from streamkit_server.core.heartbeat import MemberIdInUse

from .harness import CONFIG, Answer, Harness, request

OK = HeartbeatStatus.OK
FENCED = HeartbeatStatus.FENCED_MEMBER_EPOCH


def join(h: Harness, member_id: str, incarnation: str | None) -> Answer:
    return h.beat(
        member_id,
        request(member_id, 0, version=h.group.metadata_version, incarnation=incarnation),
    )


def steady(h: Harness, member_id: str, answer: Answer, incarnation: str | None) -> Answer:
    return h.beat(
        member_id,
        request(
            member_id,
            answer.epoch,
            owned=answer.assigned,
            version=answer.version,
            incarnation=incarnation,
        ),
    )


def reading_a() -> tuple[Harness, Answer]:
    """Member ``a`` of incarnation ``i1`` reads all four shards."""
    h = Harness()
    a = join(h, "a", "i1")
    a = steady(h, "a", a, "i1")
    assert a.status is OK and a.assigned == [0, 1, 2, 3]
    return h, a


def test_join_under_another_incarnation_is_refused_while_the_holder_lives() -> None:
    h, _ = reading_a()
    h.group.members["a"] = h.group.members["a"].model_copy(update={"member_name": "host/42"})
    before = h.group
    with pytest.raises(MemberIdInUse) as refused:
        join(h, "a", "i2")
    assert "host/42" in str(refused.value)
    assert h.group is before  # nothing was written


def test_join_without_incarnation_cannot_take_over_a_member_that_has_one() -> None:
    h, _ = reading_a()
    with pytest.raises(MemberIdInUse):
        join(h, "a", None)


def test_retried_join_of_the_same_incarnation_is_answered_as_before() -> None:
    h, _ = reading_a()
    again = join(h, "a", "i1")
    assert again.status is OK
    assert h.group.owners == {0: "a", 1: "a", 2: "a", 3: "a"}


def test_new_incarnation_takes_over_once_the_old_lease_has_run_out() -> None:
    h, _ = reading_a()
    h.advance(CONFIG.member_lease_ttl_ms + 1)
    b = join(h, "a", "i2")
    assert b.status is OK and b.assigned == [0, 1, 2, 3]
    assert h.group.members["a"].incarnation == "i2"


def test_new_incarnation_waits_while_a_fenced_holder_may_still_read() -> None:
    h, a = reading_a()
    b = join(h, "b", "j")
    # a keeps heartbeating but never gives up 2 and 3: its rebalance timeout
    # fences it while it still holds them.
    while h.group.members["a"].state is not MemberState.FENCED:
        h.advance(CONFIG.member_lease_ttl_ms // 2)
        b = steady(h, "b", b, "j")
        answer = steady(h, "a", a, "i1")
        a = Answer(answer.status, answer.epoch, a.assigned, [], answer.version, answer.raw)
        assert h.now < 2 * CONFIG.rebalance_timeout_ms
    assert h.group.shards_held_by("a")
    with pytest.raises(MemberIdInUse):
        join(h, "a", "i2")
    h.advance(CONFIG.member_lease_ttl_ms)
    b = steady(h, "b", b, "j")
    assert not h.group.shards_held_by("a")
    assert join(h, "a", "i2").status is OK


def test_heartbeat_under_another_incarnation_is_fenced_and_changes_nothing() -> None:
    h, a = reading_a()
    before = h.group
    imposter = h.beat(
        "a",
        request("a", a.epoch, owned=[], version=a.version, incarnation="i2"),
    )
    assert imposter.status is FENCED and imposter.assigned == []
    assert h.group is before
    assert steady(h, "a", a, "i1").status is OK


@pytest.mark.parametrize("incarnation", [None, "i0", "i2"])
def test_leave_under_another_incarnation_frees_nothing(incarnation: str | None) -> None:
    h, a = reading_a()
    answer = h.beat("a", request("a", -1, incarnation=incarnation))
    assert answer.status is FENCED
    assert h.group.members["a"].live
    assert h.group.owners == {0: "a", 1: "a", 2: "a", 3: "a"}
    assert steady(h, "a", a, "i1").status is OK


def test_leave_of_the_member_itself_frees_its_shards_at_once() -> None:
    h, _ = reading_a()
    answer = h.beat("a", request("a", -1, incarnation="i1"))
    assert answer.status is OK and answer.epoch == -1
    assert h.group.owners == {}
    assert h.group.members["a"].state is MemberState.LEAVING


def test_static_leave_needs_an_incarnation() -> None:
    h, _ = reading_a()
    assert h.beat("a", request("a", -2)).status is HeartbeatStatus.INVALID_REQUEST


def test_static_leave_reserves_the_shards_for_the_next_incarnation() -> None:
    h, _ = reading_a()
    b = join(h, "b", "j")
    b = steady(h, "b", b, "j")
    # b's share is pending behind a: a drains 2, 3 ... the well-behaved a
    # then restarts: static leave after draining everything.
    left = h.beat("a", request("a", -2, incarnation="i1"))
    assert left.status is OK and left.epoch == -2
    assert h.group.shards_held_by("a") == []
    reserved = sorted(s for s, m in h.group.target.items() if m == "a")
    assert reserved, "a keeps its target while it restarts"
    b = steady(h, "b", b, "j")
    assert not set(b.assigned) & set(reserved), "reserved shards are not handed to b"
    back = join(h, "a", "i2")
    assert back.status is OK and back.assigned == reserved


def test_late_heartbeat_of_a_statically_left_incarnation_is_fenced() -> None:
    h, a = reading_a()
    h.beat("a", request("a", -2, incarnation="i1"))
    late = h.beat("a", request("a", a.epoch, owned=[], version=a.version, incarnation="i1"))
    assert late.status is FENCED
    assert h.group.owners == {}


def test_reservation_ends_with_the_lease() -> None:
    h, _ = reading_a()
    b = join(h, "b", "j")
    b = steady(h, "b", b, "j")
    h.beat("a", request("a", -2, incarnation="i1"))
    for _ in range(4):
        h.advance(CONFIG.member_lease_ttl_ms // 3)
        b = steady(h, "b", b, "j")
    assert h.group.members["a"].state is MemberState.EXPIRED
    b = steady(h, "b", b, "j")
    assert b.assigned == [0, 1, 2, 3]


def test_reference_clients_without_incarnation_behave_as_before() -> None:
    h = Harness()
    a = h.join("a")
    a = h.steady("a", a)
    assert h.join("a").status is OK  # a retried join, as before
    assert h.beat("a", request("a", -1)).status is OK
    assert h.group.owners == {}
