"""Reports from a history Redis lost, and claims that Redis lost one.

Member epochs never repeat across histories (they are drawn from the clock,
and jump past clock skew when a rollback is noticed); a report whose epoch is
current but whose version is below the answer that carried the epoch proves
nothing; only a member the group knows, live, under its incarnation, with
numbers a coordinator could have issued, opens a correction round.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamkit.protocol import HeartbeatStatus, MemberState
from streamkit_server.core import begin_correction
from streamkit_server.core.draft import EPOCHS_PER_MS
from streamkit_server.core.witness import Witness, rollback_witness

from .harness import CONFIG, Answer, Harness, request

SYNC = HeartbeatStatus.SYNC_METADATA


def reading(member_id: str = "a", incarnation: str = "i1") -> tuple[Harness, Answer]:
    h = Harness(now=10_000)
    a = h.beat(member_id, request(member_id, 0, incarnation=incarnation))
    a = h.beat(
        member_id,
        request(member_id, a.epoch, owned=a.assigned, version=a.version, incarnation=incarnation),
    )
    assert a.assigned == [0, 1, 2, 3]
    return h, a


def claim(h: Harness, member_id: str, epoch: int, version: int, incarnation: str | None) -> Answer:
    return h.beat(
        member_id,
        request(member_id, epoch, owned=[0, 1, 2, 3], version=version, incarnation=incarnation),
    )


# -- numbering ---------------------------------------------------------------------


def test_epochs_are_drawn_from_the_clock() -> None:
    h, a = reading()
    assert a.epoch >= h.now * EPOCHS_PER_MS
    # The version of the first answer that carried the epoch.
    assert 0 < h.group.members["a"].epoch_version <= a.version


def test_a_noticed_rollback_jumps_epochs_past_a_member_lease_of_clock_skew() -> None:
    h, _ = reading()
    opened = begin_correction(h.group, h.now, CONFIG, h.group.metadata_version + 3)
    h.apply(opened)
    assert h.group.last_issued_member_epoch >= (h.now + CONFIG.member_lease_ttl_ms) * EPOCHS_PER_MS


steps = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=12)


@settings(max_examples=60)
@given(lost=steps, after=steps, noticed=st.booleans(), gap=st.integers(0, 5))
def test_no_epoch_is_issued_twice_across_a_rollback(
    lost: list[str], after: list[str], noticed: bool, gap: int
) -> None:
    """Heartbeats in a history Redis then loses, and in the one after it: the
    (member, epoch) pairs issued in the two never meet.  A rollback nobody
    noticed relies on the clock having moved on (``gap`` >= 1 ms); a noticed
    one (a correction round) does not, it jumps."""
    if not noticed:
        gap = max(gap, 1)
    h = Harness(now=1_000)
    fork = h.group
    answers: dict[str, Answer] = {}

    def run(members: list[str]) -> set[tuple[str, int]]:
        issued = set()
        for member_id in members:
            h.now += 1 if member_id == "c" else 0  # some steps share a millisecond
            last = answers.get(member_id)
            if last is None or last.status is not HeartbeatStatus.OK:
                answer = h.beat(member_id, request(member_id, 0, version=h.group.metadata_version))
            else:
                answer = h.beat(
                    member_id,
                    request(member_id, last.epoch, owned=last.assigned, version=last.version),
                )
            answers[member_id] = answer
            issued.add((member_id, h.group.members[member_id].member_epoch))
        return issued

    in_lost = run(lost)
    h.group = fork  # Redis restored to the fork
    answers.clear()
    h.now += gap
    if noticed:
        h.apply(begin_correction(h.group, h.now, CONFIG, h.group.metadata_version + 1))
    in_after = run(after)
    assert not in_lost & in_after


# -- the release guard ---------------------------------------------------------------


def test_a_current_epoch_with_a_version_below_its_answer_releases_nothing() -> None:
    """The epoch is the member's, but its version predates the answer that
    carried the epoch: the report was made in another history."""
    h, a = reading()
    owners = dict(h.group.owners)
    below = h.group.members["a"].epoch_version - 1
    stale = h.beat("a", request("a", a.epoch, owned=[0], version=below, incarnation="i1"))
    assert stale.status is SYNC and stale.epoch == a.epoch
    assert h.group.owners == owners


def test_a_report_that_is_not_the_newest_never_clears_a_drain_or_lowers_a_version() -> None:
    """Only a proven-current report may say a drain of a shard Redis forgot
    ended: a late retry (previous epoch) adds, never takes away."""
    h, a = reading()
    # Shard 9 is unknown to Redis: a drain of a grant Redis forgot.
    forgotten = request("a", a.epoch, owned=[0, 1, 2, 3], draining=[9], version=a.version + 5)
    forgotten.incarnation = "i1"
    h.beat("a", forgotten)
    member = h.group.members["a"]
    assert member.draining_unrecorded == [9] and member.last_reported_version == a.version + 5
    late = request("a", member.previous_member_epoch or a.epoch, owned=[0, 1, 2, 3], version=1)
    late.incarnation = "i1"
    h.beat("a", late)
    member = h.group.members["a"]
    assert member.draining_unrecorded == [9] and member.last_reported_version == a.version + 5


# -- who may witness a rollback -------------------------------------------------------


def test_a_live_member_reporting_a_plausible_higher_version_opens_a_round() -> None:
    h, a = reading()
    answer = claim(h, "a", a.epoch, a.version + 3, "i1")
    assert answer.status is SYNC and h.group.correction is not None


def test_an_unknown_member_claiming_a_future_version_opens_no_round() -> None:
    """The hostile caller of the probe: a made-up member id and 2**62."""
    h, _ = reading()
    before = h.group
    answer = claim(h, "intruder", 7, 2**62, None)
    assert answer.status is HeartbeatStatus.UNKNOWN_MEMBER_ID
    assert h.group.correction is None and h.group is before


def test_a_departed_member_claiming_a_higher_version_opens_no_round() -> None:
    h, a = reading()
    h.beat("a", request("a", -1, version=a.version, incarnation="i1"))
    assert h.group.members["a"].state is MemberState.LEAVING
    claim(h, "a", a.epoch, a.version + 3, "i1")
    assert h.group.correction is None


def test_another_incarnation_claiming_a_higher_version_opens_no_round() -> None:
    h, a = reading()
    answer = claim(h, "a", a.epoch, a.version + 3, "forged")
    assert answer.status is HeartbeatStatus.FENCED_MEMBER_EPOCH
    assert h.group.correction is None


def test_the_member_itself_with_implausible_numbers_is_resynced_without_a_round() -> None:
    h, a = reading()
    owners = dict(h.group.owners)
    for epoch, version in ((a.epoch, 2**62), (2**62, a.version)):
        answer = claim(h, "a", epoch, version, "i1")
        assert answer.status is SYNC and answer.epoch == a.epoch
        assert h.group.correction is None and h.group.owners == owners
    # ...and back in step at once with the numbers it was given.
    again = claim(h, "a", answer.epoch, answer.version, "i1")
    assert again.status is HeartbeatStatus.OK


def test_the_verdicts_name_why_a_claim_is_ignored() -> None:
    h, a = reading()
    group, now = h.group, h.now

    def verdict(member_id: str, epoch: int, version: int, incarnation: str | None) -> Witness:
        req = request(member_id, epoch, version=version, incarnation=incarnation)
        return rollback_witness(group, req, now, CONFIG)

    assert verdict("a", a.epoch, a.version, "i1") is Witness.NONE
    assert verdict("a", a.epoch, a.version + 1, "i1") is Witness.ACCEPTED
    assert verdict("a", a.epoch + 1, a.version, "i1") is Witness.ACCEPTED
    assert verdict("zz", 5, a.version + 1, None) is Witness.UNKNOWN_MEMBER
    assert verdict("a", a.epoch, a.version + 1, "i2") is Witness.OTHER_INCARNATION
    assert verdict("a", a.epoch, 2**40, "i1") is Witness.IMPLAUSIBLE
    assert Witness.IMPLAUSIBLE.ignored and not Witness.ACCEPTED.ignored
