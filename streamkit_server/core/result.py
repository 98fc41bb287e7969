"""What a core operation returns: the next state, the changes to persist, the answer.

Kafka's group coordinator answers every request with ``CoordinatorResult(records,
response)``: the runtime appends the records and only then sends the response.
``Result`` is the same shape.  ``changes`` are small typed records that say
*what* changed, so the store can write just that: a steady heartbeat changes
one member record, and only that record is written (see ``store/metadata.py``).

``state`` is the group after the operation (``None`` once it is deleted); the
service threads it through a batch of operations and keeps it as its parse
cache.  It is never written whole except on create and on an upgrade.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from .model import GroupMetadata, MemberMetadata

__all__ = [
    "Change",
    "GroupCreated",
    "GroupDeleted",
    "GroupDocumentChanged",
    "MemberRemoved",
    "MemberUpserted",
    "Result",
    "WitnessSeen",
    "diff",
    "merge_changes",
    "result_of",
    "steady",
]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class MemberUpserted:
    """One member record is new or changed (liveness, lease, progress, epoch...)."""

    member: MemberMetadata


@dataclass(frozen=True, slots=True)
class MemberRemoved:
    member_id: str


@dataclass(frozen=True, slots=True)
class GroupDocumentChanged:
    """Something outside the member records changed: target, owners, epochs,
    metadataVersion, layout, migrations, the correction round.  Always written
    with the revision compare-and-set of the whole group."""


@dataclass(frozen=True, slots=True)
class GroupCreated:
    pass


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    pass


Change = MemberUpserted | MemberRemoved | GroupDocumentChanged | GroupCreated | GroupDeleted

DOCUMENT_CHANGED: Final = GroupDocumentChanged()


@dataclass(frozen=True, slots=True)
class WitnessSeen:
    """A report claimed state Redis lacks (see ``core.witness``).

    Not a change: the service counts it by ``verdict`` and audits the claims
    it ignored, so a forged or confused witness leaves a trace.
    """

    verdict: str  # a ``core.witness.Witness`` value other than "none"
    member_id: str
    claimed_version: int
    stored_version: int
    claimed_epoch: int
    stored_epoch: int | None  # None: no such member

    @property
    def ignored(self) -> bool:
        return self.verdict != "accepted"


@dataclass(frozen=True, slots=True)
class Result(Generic[R]):
    state: GroupMetadata | None
    changes: tuple[Change, ...]
    response: R
    witness: WitnessSeen | None = None

    @property
    def changed(self) -> bool:
        return bool(self.changes)


# Every group field except the member records and the write stamp: a change in
# any of them is a document change.
_DOCUMENT_FIELDS: Final = tuple(
    name for name in GroupMetadata.model_fields if name not in ("members", "updated_at_ms")
)


def diff(
    before: GroupMetadata | None,
    after: GroupMetadata | None,
    touched: Iterable[str] | None = None,
) -> tuple[Change, ...]:
    """The changes that turn ``before`` into ``after``.

    ``touched``: the member ids that may differ, when the caller tracked them
    (the heartbeat does, so a steady heartbeat stays O(1) in the number of
    members); otherwise every member is compared.

    When only member records changed, ``after.updated_at_ms`` is set back to
    ``before``'s: the stamp records the last *document* write, which is what
    the store keeps (a member-only write does not rewrite the document).
    """
    if after is before:
        return ()
    if after is None:
        return (GroupDeleted(),)
    if before is None:
        return (GroupCreated(),)
    changes: list[Change] = []
    ids = after.members.keys() | before.members.keys() if touched is None else touched
    for member_id in sorted(ids):
        new = after.members.get(member_id)
        old = before.members.get(member_id)
        if new is None:
            if old is not None:
                changes.append(MemberRemoved(member_id))
        elif new is not old and (old is None or new.__dict__ != old.__dict__):
            # The field values, which is what pydantic's ``!=`` finds unequal
            # for two member records (no extra or private attributes), after
            # checks and a fallback that cost ten times the comparison.
            changes.append(MemberUpserted(new))
    if _document_changed(before, after):
        changes.append(DOCUMENT_CHANGED)
    else:
        after.updated_at_ms = before.updated_at_ms
    return tuple(changes)


def _document_changed(before: GroupMetadata, after: GroupMetadata) -> bool:
    # Runs per heartbeat: the field values straight from the models' dicts.
    # A draft shares every map it did not write (``Draft``), so an untouched
    # field is the same object and costs an identity check.
    old, new = before.__dict__, after.__dict__
    for name in _DOCUMENT_FIELDS:
        a, b = old[name], new[name]
        if a is not b and a != b:
            return True
    return False


def result_of(
    before: GroupMetadata | None,
    after: GroupMetadata | None,
    response: R,
    touched: Iterable[str] | None = None,
) -> Result[R]:
    """The ``Result`` of an operation that turned ``before`` into ``after``.

    A new object with no actual change (a heartbeat at the same millisecond)
    counts as no change: the state stays ``before``.
    """
    changes = diff(before, after, touched)
    return Result(after if changes else before, changes, response)


def steady(changes: Sequence[Change]) -> bool:
    """Only member records changed: the store may skip the document."""
    return all(isinstance(c, MemberUpserted) for c in changes)


def merge_changes(batches: Iterable[Sequence[Change]]) -> tuple[Change, ...]:
    """The changes of several operations applied in order, as one write.

    The last record of a member wins; a create or a document change anywhere
    makes the whole write a document write.
    """
    members: dict[str, Change] = {}
    flags: dict[type, Change] = {}
    for changes in batches:
        for change in changes:
            if isinstance(change, MemberUpserted):
                members[change.member.member_id] = change
            elif isinstance(change, MemberRemoved):
                members[change.member_id] = change
            elif isinstance(change, GroupDeleted):
                return (change,)
            else:
                flags[type(change)] = change
    return (*members.values(), *flags.values())
