"""A member whose client sends no incarnation (the reference clients) is
bound to the principal that joined it: no other member credential can leave
it, report for it, take its id over while it lives, or claim a rollback in its
name.  (Our own clients send an incarnation, which already does this.)"""

from __future__ import annotations

import pytest

from streamkit.protocol import HeartbeatStatus
from streamkit_server.core import handle_heartbeat, new_group
from streamkit_server.core.heartbeat import MemberIdInUse
from streamkit_server.core.model import MemberMetadata

from .harness import CONFIG, Harness, request


def _beat(h: Harness, principal: str | None, member: str, epoch: int, **kw: object):  # type: ignore[no-untyped-def]
    kw.setdefault("version", h.group.metadata_version)
    req = request(member, epoch, **kw)  # type: ignore[arg-type]
    result = handle_heartbeat(h.group, member, req, h.now, CONFIG, principal)
    h.apply(result)
    return result


def _settled() -> tuple[Harness, int]:
    h = Harness(group=new_group("s", "g", 2, 0))
    joined = _beat(h, "alice", "ref-1", 0)
    epoch = int(joined.response.member_epoch or 0)
    _beat(h, "alice", "ref-1", epoch, owned=[])
    answer = _beat(h, "alice", "ref-1", epoch, owned=[0, 1])
    assert h.group.shards_held_by("ref-1") == [0, 1], answer.response
    return h, epoch


def test_another_principal_cannot_leave_or_report_for_the_member() -> None:
    h, epoch = _settled()
    before = h.group
    for forged in (
        _beat(h, "mallory", "ref-1", -1),  # a leave would free both shards at once
        _beat(h, "mallory", "ref-1", epoch, owned=[]),  # "I hold nothing"
    ):
        assert forged.response.status is HeartbeatStatus.FENCED_MEMBER_EPOCH
    assert h.group.shards_held_by("ref-1") == [0, 1]
    assert h.group.members["ref-1"].live and h.group == before
    # The member itself still can.
    left = _beat(h, "alice", "ref-1", -1)
    assert left.response.status is HeartbeatStatus.OK
    assert not h.group.members["ref-1"].live and not h.group.shards_held_by("ref-1")


def test_another_principal_cannot_take_the_id_over_or_claim_a_rollback() -> None:
    h, epoch = _settled()
    with pytest.raises(MemberIdInUse):
        _beat(h, "mallory", "ref-1", 0)
    claim = _beat(h, "mallory", "ref-1", epoch, owned=[0, 1], version=h.group.metadata_version + 5)
    assert claim.witness is not None and claim.witness.verdict == "other-incarnation"
    assert h.group.correction is None


def test_a_record_from_before_principal_identities_accepts_its_member() -> None:
    # Stored by an earlier release (no identity): the member keeps working,
    # from whichever principal, until it joins again.
    h, epoch = _settled()
    legacy = h.group.members["ref-1"].model_copy(update={"incarnation": None})
    h.group.members = {**h.group.members, "ref-1": legacy}
    assert isinstance(legacy, MemberMetadata)
    again = _beat(h, "alice", "ref-1", epoch, owned=[0, 1])
    assert again.response.status is HeartbeatStatus.OK


def test_without_a_principal_nothing_changes() -> None:
    # The insecure member switch: no caller is known, today's rules apply.
    h = Harness(group=new_group("s", "g", 2, 0))
    joined = _beat(h, None, "ref-1", 0)
    assert h.group.members["ref-1"].incarnation is None
    left = _beat(h, None, "ref-1", -1)
    assert joined.response.status is left.response.status is HeartbeatStatus.OK


def test_an_incarnation_posing_as_a_principal_is_refused() -> None:
    h, _ = _settled()
    before = h.group
    posing = _beat(h, "mallory", "ref-1", -1, incarnation="principal:alice")
    assert posing.response.status is HeartbeatStatus.INVALID_REQUEST
    assert h.group == before and h.group.shards_held_by("ref-1") == [0, 1]
