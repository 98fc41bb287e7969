"""The periodic tick: lease expiry, rebalance-timeout fencing, clean-up."""

from __future__ import annotations

from .config import CoordinatorConfig
from .deadlines import earliest_deadline_ms
from .draft import Draft
from .model import GroupMetadata
from .resharding import advance_migration
from .result import Result, result_of


def tick(group: GroupMetadata, now_ms: int, config: CoordinatorConfig) -> Result[bool]:
    """Apply every timeout due at ``now_ms``; answers whether anything was due.

    Nothing due: no changes, and ``state`` is ``group`` itself.
    """
    draft = Draft(group, now_ms, config)
    draft.apply_timeouts()
    advance_migration(draft)
    result = result_of(group, draft.finish(), False)
    return Result(result.state, result.changes, result.changed)


def next_deadline_ms(group: GroupMetadata, config: CoordinatorConfig) -> int | None:
    """The earliest time at which ``tick`` would change something, if any.

    Lets the server's loop skip loading groups that have nothing due.
    """
    return earliest_deadline_ms(group, config)


def begin_correction(
    group: GroupMetadata, now_ms: int, config: CoordinatorConfig, reported_version: int
) -> Result[None]:
    """Open a metadata correction round without a client asking for it.

    For a coordinator process that notices on its own that Redis went back
    (it loaded a lower revision than it wrote): the same round a member's
    higher metadataVersion would open, so grants wait out forgotten leases.
    """
    draft = Draft(group, now_ms, config)
    draft.open_correction(reported_version)
    return result_of(group, draft.finish(), None)
