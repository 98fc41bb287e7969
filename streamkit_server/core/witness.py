"""Which heartbeats may prove that Redis lost writes (open a correction round).

A member that reports a metadataVersion above the stored one, or an epoch
above the one its record holds, saw state Redis no longer has: a correction
round must hold every grant back until the leases that the lost writes
renewed have run out.  A round is also a cost (no shard moves while it is
open), so a claim opens one only when it could be true:

* it comes from a member the group knows, live, under the incarnation that
  member joined with.  Any holder of a member credential can send a report
  for an id it makes up, or for a member that left, and nothing tells such a
  claim from a genuine one, so it is not evidence.  (A member that joined in
  the lost history is unknown to Redis: it is told so and stops reading.  The
  rollback it saw is still noticed by the coordinator process that saw the
  lost writes, or by the failover stamp; a same-server restore that only
  such a member witnessed is the documented gap, docs/testing.md.)
* the numbers are within reach: a version at most one per millisecond above
  the stored one since the stored document was written (plus
  ``VERSION_SLACK``), an epoch no higher than a coordinator clock could have
  issued by now (``draft.epoch_floor``) allowing for the skew leases allow.

Everything else is ignored (the service counts and audits it) and the report
changes nothing: it is answered SYNC_METADATA when it came from the member
itself, so the member takes Redis' view again.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from streamkit.protocol import HeartbeatRequest

from .config import CoordinatorConfig
from .draft import epoch_floor
from .model import GroupMetadata, same_process

__all__ = ["VERSION_SLACK", "Witness", "rollback_witness"]

#: Versions a claim may run ahead of the stored one beyond the time-based
#: allowance: a restore to a snapshot written a moment before a burst of
#: changes.  A group's document writes are serialised through one mutex and
#: one Redis round trip each, so one per millisecond is already generous.
VERSION_SLACK: Final = 10_000


class Witness(StrEnum):
    NONE = "none"  # the report claims nothing Redis lacks
    ACCEPTED = "accepted"  # it opens (or restarts the wait of) a correction round
    UNKNOWN_MEMBER = "unknown-member"
    NOT_LIVE = "not-live"
    OTHER_INCARNATION = "other-incarnation"
    IMPLAUSIBLE = "implausible"

    @property
    def ignored(self) -> bool:
        return self not in (Witness.NONE, Witness.ACCEPTED)


def rollback_witness(
    group: GroupMetadata, request: HeartbeatRequest, now_ms: int, config: CoordinatorConfig
) -> Witness:
    """Whether ``request`` proves a rollback, is ignored as a claim, or claims none."""
    member = group.members.get(request.member_id)
    version_ahead = request.metadata_version > group.metadata_version
    epoch_ahead = (
        member is not None
        and request.member_epoch > 0
        and request.member_epoch > member.member_epoch
    )
    if not (version_ahead or epoch_ahead):
        return Witness.NONE
    if member is None:
        return Witness.UNKNOWN_MEMBER
    if not member.live:
        return Witness.NOT_LIVE
    if not same_process(member, request.incarnation):
        return Witness.OTHER_INCARNATION
    since_written = max(0, now_ms - group.updated_at_ms)
    if request.metadata_version > group.metadata_version + VERSION_SLACK + since_written:
        return Witness.IMPLAUSIBLE
    # A lost history may have jumped once past clock skew itself (at a round
    # of its own): twice the jump ``open_correction`` makes is the most a
    # genuine epoch can be ahead of this clock.
    if request.member_epoch > epoch_floor(now_ms + 2 * config.member_lease_ttl_ms + 1):
        return Witness.IMPLAUSIBLE
    return Witness.ACCEPTED
