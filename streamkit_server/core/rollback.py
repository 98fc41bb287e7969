"""Noticing that Redis went back in time (lost writes, failover, restore).

A coordinator process remembers, per group, the highest store revision it has
seen in the group's current lifecycle (``created_at_ms`` tells lifecycles
apart: a deleted and recreated group starts again at revision 1).  Loading a
lower revision of the same lifecycle means Redis lost writes this process saw,
and some of them may have granted shards whose holders still read inside their
lease: the caller opens a metadata correction round (``begin_correction``).

``observe`` is pure: the caller keeps the returned ``Seen`` and passes it back
next time.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Observation", "Seen", "observe"]


@dataclass(frozen=True, slots=True)
class Seen:
    lifecycle: int
    revision: int
    metadata_version: int


@dataclass(frozen=True, slots=True)
class Observation:
    #: What to remember from now on.
    seen: Seen
    #: Set when a correction round must open: the highest metadataVersion seen.
    regressed_from_version: int | None = None


def observe(
    seen: Seen | None,
    lifecycle: int,
    revision: int,
    metadata_version: int,
    *,
    locked: bool,
    server_changed: bool = False,
) -> Observation:
    """Compare a loaded (or written) revision with what was seen before.

    A regression is reported once, and only to a caller holding the group
    mutex (``locked``): it opens the round and writes it, and from then on the
    new, lower revision line is the one to follow.  A read-only load must not
    consume the report, or no round would open.

    ``server_changed`` says the group was last written by another Redis
    server incarnation (a failover, restart or restore happened since).
    Writes may then have been lost that this process never saw: another
    process made them, so no revision of ours can tell.  That is reported as
    a regression too, whatever the revisions say; the round it opens restamps
    the group, so it is reported once per server change.
    """
    current = Seen(lifecycle, revision, metadata_version)
    if server_changed and locked:
        same_lifecycle = seen is not None and seen.lifecycle == lifecycle
        highest = max(metadata_version, seen.metadata_version if seen and same_lifecycle else 0)
        return Observation(current, highest)
    if seen is None or seen.lifecycle != lifecycle:
        return Observation(current)
    if revision < seen.revision:
        if not locked:
            return Observation(seen)
        return Observation(current, max(seen.metadata_version, metadata_version))
    if revision > seen.revision:
        return Observation(current)
    return Observation(seen)
