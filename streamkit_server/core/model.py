"""The coordinator's group aggregate: a group document plus one record per member
(see ``store/metadata.py`` for how they are laid out in Redis).

Ownership is kept as two shard -> member maps:

* ``target``: where each shard should live (the assignor's output).
* ``owners``: which member may currently hold the shard.  A shard leaves
  ``owners`` only when its holder reported it released, expired, or was fenced
  long enough ago that its local lease must have run out.  A shard is granted
  (written into ``owners``) only while processing its target member's own
  heartbeat, so every grant a member hears about is already in Redis.

Everything a member is told is derived from these maps, which is what makes a
lost or repeated heartbeat response harmless.

The per-member questions (which shards does it hold, which are its target)
are answered from an index of both maps by member, built once per pair of
maps and kept on the group, so a heartbeat costs what the member holds, not
what the group holds.  The maps are values: only ``Draft`` changes one in
place (its own copy), and it drops the index when it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from pydantic.alias_generators import to_camel

from streamkit.protocol import GroupState, MemberState, MigrationState

SCHEMA_VERSION = 1
# 1: the whole aggregate in one hash field; 2: a group document plus one hash
# field per member, so a steady heartbeat writes only its member's record.
LAYOUT_VERSION = 2

#: "Nothing is due": the timeout bound of a group with no member, no
#: migration and no correction round.
NEVER_MS = 2**62

LIVE_STATES = frozenset({MemberState.STARTING, MemberState.ACTIVE})

_M = TypeVar("_M", bound=BaseModel)
_new = object.__new__
_set = object.__setattr__


def replaced(model: _M, /, **changes: object) -> _M:
    """``model.model_copy(update=changes)``, at a third of its cost.

    A heartbeat copies the group, its member record and the request: through
    pydantic's generic copy (``copy.copy`` of each of the model's dicts) that
    was a tenth of the core's time per heartbeat.  The same copy: a shallow
    copy of the field values with ``changes`` applied unvalidated, the fields
    set, and the private attributes (the group's ownership index) shared.
    ``changes`` must name fields (tests/core/test_replaced.py compares it
    with ``model_copy``).
    """
    fields = model.__dict__.copy()
    fields.update(changes)
    copied = _new(type(model))
    _set(copied, "__dict__", fields)
    _set(copied, "__pydantic_fields_set__", model.__pydantic_fields_set__ | changes.keys())
    extra = model.__pydantic_extra__
    _set(copied, "__pydantic_extra__", None if extra is None else extra.copy())
    private = model.__pydantic_private__
    _set(copied, "__pydantic_private__", None if private is None else private.copy())
    return copied


class _Aggregate(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class ShardProgress(_Aggregate):
    stream_key: str | None = None
    last_delivered_id: str | None = None
    last_acked_id: str | None = None
    pending_count: int = 0
    updated_at_ms: int | None = None


#: The stored identity of a member whose client sends no incarnation (the
#: reference clients): the principal that joined it, so that no other
#: credential can act as that member (leave it, report for it).
PRINCIPAL_IDENTITY: Final = "principal:"


def same_process(member: MemberMetadata, incarnation: str | None) -> bool:
    """Whether a request under ``incarnation`` comes from the process ``member`` is.

    ``incarnation`` is the request's, or the principal identity the core put
    in its place (``caller_identity``).  A record stored before principal
    identities existed has none: it accepts what it accepted then (no
    incarnation), from any principal, until its member joins again.  So does
    a record the previous release rewrote (it drops ``principal``, a field it
    does not know).
    """
    if member.principal is not None:
        return incarnation == PRINCIPAL_IDENTITY + member.principal
    if member.incarnation is None and incarnation is not None:
        return incarnation.startswith(PRINCIPAL_IDENTITY)
    return member.incarnation == incarnation


def identity(incarnation: str | None) -> dict[str, str | None]:
    """The member record's ``incarnation`` and ``principal`` for a join under
    ``incarnation`` (a principal identity is kept apart, see ``principal``)."""
    if incarnation is not None and incarnation.startswith(PRINCIPAL_IDENTITY):
        return {"incarnation": None, "principal": incarnation.removeprefix(PRINCIPAL_IDENTITY)}
    return {"incarnation": incarnation, "principal": None}


class MemberMetadata(_Aggregate):
    member_id: str
    member_name: str | None = None
    state: MemberState = MemberState.STARTING
    # The per-start token of the process behind this member id (None for
    # clients that send none): a join, heartbeat or leave under another
    # incarnation comes from a different process and must not act as this one.
    incarnation: str | None = None
    # The principal that joined a member whose client sends no incarnation
    # (``same_process``).  A field of its own, not the incarnation: the
    # previous release compares incarnations and would take a principal
    # stored there for another process (docs/operations.md, "Upgrades and
    # rollbacks").
    principal: str | None = None
    # Set when a static member left to restart (memberEpoch -2): it drained and
    # holds nothing, but its target shards stay reserved for its member id
    # until its lease runs out, so a rolling restart moves nothing.
    static_leave_at_ms: int | None = None
    member_epoch: int = 0
    # The epoch before the last bump: a heartbeat carrying it is a retry whose
    # response was lost, answered with the current view instead of a fence.
    previous_member_epoch: int = 0
    # The metadataVersion of the answer that carried ``member_epoch``.  The
    # member reports at least this version with that epoch from then on, so a
    # report with the epoch and a lower version was not made after that
    # answer: it comes from a history Redis no longer has.
    epoch_version: int = 0
    joined_at_ms: int = 0
    last_heartbeat_ms: int = 0
    # The readable shard set and owned set last communicated to the member;
    # the member epoch bumps exactly when either changes.
    assigned: list[int] = Field(default_factory=list)
    holding: list[int] = Field(default_factory=list)
    # Set when the member first holds a shard it must give up; passing it
    # fences the member (the rebalance timeout).
    revoke_deadline_ms: int | None = None
    fenced_at_ms: int | None = None
    # When the member stopped being live (expired, fenced, left).
    dead_since_ms: int | None = None
    last_reported_version: int = 0
    # Shards the member reports it is still draining that Redis does not
    # record it as holding: after a rollback, grants Redis forgot.  Entries
    # may be in flight there, so a correction round stays open until they
    # are done (or the member is fenced and its lease has run out).
    draining_unrecorded: list[int] = Field(default_factory=list)
    runtime_max_concurrency: int = 1
    available_concurrency: int = 0
    progress: dict[int, ShardProgress] = Field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


class CorrectionRound(_Aggregate):
    """A metadata correction round, opened when a client proved Redis lost writes."""

    started_at_ms: int
    # The stored metadataVersion when the round began and the highest version a
    # client reported: both kept for operators and alerts.
    stored_version: int
    highest_reported_version: int


class MigrationRecord(_Aggregate):
    """One resharding operation of a group (see ``resharding.py``)."""

    resharding_id: str
    from_shard_count: int
    to_shard_count: int
    state: MigrationState
    created_at_ms: int
    updated_at_ms: int
    requested_by: str | None = None
    reason: str | None = None
    # When producers were pointed at the new layout; removed shards are not
    # proven drained before every producer's routing lease from then has run out.
    switched_at_ms: int | None = None
    # Shards the layout change takes away: drained, then retired.
    removed_shards: list[int] = Field(default_factory=list)
    retired_shards: list[int] = Field(default_factory=list)
    # The layouts the migration switches from and to, and the shards it
    # creates for the new one.
    previous_layout: list[int] = Field(default_factory=list)
    new_layout: list[int] = Field(default_factory=list)
    added_shards: list[int] = Field(default_factory=list)
    # Ordered (per-key) mode: the added shards are not read before every
    # removed shard is drained and retired.
    ordered: bool = False

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_MIGRATION_STATES


ACTIVE_MIGRATION_STATES = frozenset(
    {
        MigrationState.PREPARING,
        MigrationState.ACTIVE,
        MigrationState.DRAINING,
        MigrationState.ROLLING_BACK,
    }
)


@dataclass(frozen=True, slots=True)
class _Ownership:
    """``owners`` and ``target`` by member (sorted shard lists), for those two maps."""

    owners: dict[int, str]
    target: dict[int, str]
    sizes: tuple[int, int]
    held: dict[str, list[int]]
    targeted: dict[str, list[int]]

    @classmethod
    def of(cls, owners: dict[int, str], target: dict[int, str]) -> _Ownership:
        sizes = (len(owners), len(target))
        return cls(owners, target, sizes, _by_member(owners), _by_member(target))

    def describes(self, owners: dict[int, str], target: dict[int, str]) -> bool:
        # Identity, not equality: the index holds the maps it was built from,
        # so a map replaced since cannot share its id.  The sizes catch a map
        # grown or shrunk in place by code that forgot to drop the index.
        return (
            self.owners is owners
            and self.target is target
            and self.sizes == (len(owners), len(target))
        )


def _by_member(shards: dict[int, str]) -> dict[str, list[int]]:
    by_member: dict[str, list[int]] = {}
    for shard in sorted(shards):
        member = shards[shard]
        found = by_member.get(member)
        if found is None:
            by_member[member] = [shard]
        else:
            found.append(shard)
    return by_member


class GroupMetadata(_Aggregate):
    stream_prefix: str
    consumer_group: str
    shard_count: int
    group_epoch: int = 0
    assignment_epoch: int = 0
    metadata_version: int = 1
    # The highest member epoch issued in this group.  Epochs are drawn from
    # the clock (``Draft.issue_epoch``), not only from this counter: Redis can
    # lose writes and roll the counter back, and a number issued again for
    # another assignment would let a report from the lost history pass as
    # current.  See docs/concepts.md, "Epochs never repeat".
    last_issued_member_epoch: int = 0
    state: GroupState = GroupState.EMPTY
    members: dict[str, MemberMetadata] = Field(default_factory=dict)
    target: dict[int, str] = Field(default_factory=dict)
    owners: dict[int, str] = Field(default_factory=dict)
    # The physical shard behind each routing index: producers send partition
    # key hash ``i`` to stream ``{stream_prefix}:{layout[i]}``.  The identity
    # ``range(shard_count)`` unless an ordered reshard allocated fresh shards.
    layout: list[int] = Field(default_factory=list)
    # Shards no longer in the layout that still have to be drained after a
    # layout change; they stay assignable until proven drained.
    draining_shards: list[int] = Field(default_factory=list)
    # Shards in the layout (producers write to them) that consumers may not
    # read yet: the children of an ordered reshard wait for their parents.
    held_shards: list[int] = Field(default_factory=list)
    correction: CorrectionRound | None = None
    # A lower bound of the earliest timeout (lease expiry, rebalance timeout,
    # fenced holdings, clean-up, correction round): until then the timeout
    # scan is skipped.  Derived, recomputed whenever it could move earlier.
    next_timeout_ms: int = 0
    correction_rounds_started: int = 0
    migrations: list[MigrationRecord] = Field(default_factory=list)
    created_at_ms: int = 0
    updated_at_ms: int = 0
    # Kept across copies (``model_copy`` shares it); valid while ``owners`` and
    # ``target`` are the very maps it was built from (``_ownership``).
    _index: _Ownership | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        # Pydantic's equality also compares private attributes: two equal
        # groups must stay equal whether or not one has built its index.
        if not isinstance(other, GroupMetadata):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def _ownership(self) -> _Ownership:
        # Through the private-attribute dict: reading ``self._index`` goes
        # through pydantic's ``__getattr__``, which costs more than the lookup.
        private = self.__pydantic_private__
        assert private is not None
        index: _Ownership | None = private["_index"]
        if index is None or not index.describes(self.owners, self.target):
            index = private["_index"] = _Ownership.of(self.owners, self.target)
        return index

    def forget_ownership_index(self) -> None:
        """``owners`` or ``target`` is about to change in place (``Draft`` only)."""
        self._index = None

    def active_migration(self) -> MigrationRecord | None:
        return next((m for m in reversed(self.migrations) if m.active), None)

    @model_validator(mode="after")
    def _default_layout(self) -> GroupMetadata:
        if not self.layout and self.shard_count:
            self.layout = list(range(self.shard_count))
        if len(self.layout) != self.shard_count:
            raise ValueError("layout must name exactly shard_count shards")
        return self

    def assignable_shards(self) -> list[int]:
        shards = set(self.layout)
        shards.update(self.draining_shards)
        shards.difference_update(self.held_shards)
        return sorted(shards)

    def known_shards(self) -> set[int]:
        """Every physical shard the group still has a stream for."""
        return set(self.layout) | set(self.draining_shards) | set(self.held_shards)

    def live_member_ids(self) -> list[str]:
        return sorted(m for m, meta in self.members.items() if meta.live)

    def shards_held_by(self, member_id: str) -> list[int]:
        return list(self._ownership().held.get(member_id, ()))

    def assigned_to(self, member_id: str) -> list[int]:
        """Shards the member may read: it holds them and they are its target."""
        target = self.target
        return [s for s in self._ownership().held.get(member_id, ()) if target.get(s) == member_id]

    def revoking_from(self, member_id: str) -> list[int]:
        """Shards the member holds but must drain and release."""
        target = self.target
        return [s for s in self._ownership().held.get(member_id, ()) if target.get(s) != member_id]

    def pending_for(self, member_id: str) -> list[int]:
        """Target shards of the member that it may not read yet."""
        owners = self.owners
        return [
            s for s in self._ownership().targeted.get(member_id, ()) if owners.get(s) != member_id
        ]


def new_group(
    stream_prefix: str,
    consumer_group: str,
    shard_count: int,
    now_ms: int,
    layout: Sequence[int] = (),
) -> GroupMetadata:
    """A group created at ``now_ms`` on ``layout`` (none: the identity ``0..shard_count-1``)."""
    if shard_count < 0:
        raise ValueError("shard_count must not be negative")
    return GroupMetadata(
        stream_prefix=stream_prefix,
        consumer_group=consumer_group,
        shard_count=shard_count,
        # Validated against shard_count, like any layout the group is read with.
        layout=list(layout),
        next_timeout_ms=NEVER_MS,
        created_at_ms=now_ms,
        updated_at_ms=now_ms,
    )
