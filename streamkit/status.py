"""A consumer group at a glance: ``streamkit status`` and the demo's live view.

Three monitoring reads (the group, its members, its shards' offsets), shown
either as rich tables (a terminal) or as plain lines (logs, pipes), so the
same picture works in both places.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from streamkit.cli.output import printable
from streamkit.coordinator_client import CoordinatorClient
from streamkit.protocol import (
    GroupResponse,
    MemberState,
    MemberView,
    StreamShardOffset,
    shard_indexes,
)

__all__ = [
    "DEPARTED_RETENTION_S",
    "GroupStatus",
    "departure",
    "fetch_status",
    "headline",
    "plain_lines",
    "render",
]

#: How long the coordinator keeps the record of a member that left, expired
#: or was fenced, once it holds no shard (``dead_member_retention_ms`` of the
#: server core; a test keeps the two equal).  Until then status shows it.
DEPARTED_RETENTION_S = 300
_LIVE = (MemberState.STARTING, MemberState.ACTIVE)


@dataclass(frozen=True)
class GroupStatus:
    group: GroupResponse
    members: list[MemberView]
    shards: list[StreamShardOffset]

    @property
    def drained(self) -> bool:
        """Every shard known, with lag 0 and nothing pending."""
        return bool(self.shards) and all(s.lag == 0 and not s.pending_count for s in self.shards)


async def fetch_status(client: CoordinatorClient, stream_prefix: str, group: str) -> GroupStatus:
    """The group, its members and its shards' offsets (READ role)."""
    # One after another: three small reads, and a 404 stops at the first.
    group_response = await client.get_group(stream_prefix, group)
    members = await client.list_members(stream_prefix, group)
    offsets = await client.get_offsets(stream_prefix, group)
    return GroupStatus(group_response, members.members, offsets.shards)


def _lag(shard: StreamShardOffset) -> str:
    # Unknown lag is shown as such, never as 0 (Redis could not prove it).
    return "?" if shard.lag is None else str(shard.lag)


def _owners(shard: StreamShardOffset) -> str:
    return ", ".join(shard.owner_member_ids) or "-"


def _assigned(member: MemberView) -> str:
    return ",".join(str(s) for s in shard_indexes(member.current_assignment)) or "-"


def departure(member: MemberView) -> str:
    """Empty for a live member; else since when it is gone and when the
    coordinator forgets it (from its last heartbeat, when the server says)."""
    if member.state in _LIVE or member.state is None:
        return ""
    age_ms = (member.model_extra or {}).get("heartbeatAgeMs")
    if not isinstance(age_ms, int):
        return f"departed; forgotten {DEPARTED_RETENTION_S // 60} min after it left"
    age = age_ms // 1000
    if member.state is MemberState.LEAVING:
        # A leave is the member's last heartbeat: the retention counts from it.
        left = max(0, DEPARTED_RETENTION_S - age)
        return f"left {age}s ago; forgotten in {left}s"
    # Expired or fenced: the retention counts from the expiry (or the release
    # of its shards), which comes after the last heartbeat.
    return f"last heartbeat {age}s ago; forgotten {DEPARTED_RETENTION_S // 60} min after it ended"


def headline(status: GroupStatus) -> str:
    g = status.group
    live = sum(1 for m in status.members if m.state in _LIVE)
    gone = len(status.members) - live
    members = f"members {live}" + (f" (+{gone} departed)" if gone else "")
    return (
        f"{g.stream_prefix}/{g.consumer_group}  state {g.state.value}  shards {g.shard_count}  "
        f"{members}  "
        f"groupEpoch {g.group_epoch}  assignmentEpoch {g.assignment_epoch}  "
        f"metadataVersion {g.metadata_version}"
        + (
            f"  migration {g.active_migration.state.value}"
            if g.active_migration is not None and g.active_migration.state is not None
            else ""
        )
    )


def render(
    status: GroupStatus, *, head: str | None = None, rates: Mapping[str, float] | None = None
) -> Group:
    """Header, shards table and members table (``rates``: msgs/s per member)."""
    shards = Table(title="shards", expand=True)
    for column in ("shard", "stream key", "owner", "length", "lag", "pending"):
        shards.add_column(
            column, justify="right" if column in ("length", "lag", "pending") else "left"
        )
    for shard in status.shards:
        shards.add_row(
            *_cells(
                str(shard.shard.shard_index if shard.shard else "?"),
                shard.stream_key or "",
                _owners(shard),
                str(shard.stream_length or 0),
                _lag(shard),
                str(shard.pending_count or 0),
            )
        )
    members = Table(title="members", expand=True)
    columns = ["member", "state", "epoch", "shards"] + (["msgs/s"] if rates is not None else [])
    columns.append("departed")
    for column in columns:
        members.add_column(column)
    for member in status.members:
        row = [
            member.member_id or "",
            member.state.value if member.state else "",
            str(member.member_epoch if member.member_epoch is not None else ""),
            _assigned(member),
        ]
        if rates is not None:
            row.append(f"{rates.get(member.member_id or '', 0.0):.0f}")
        row.append(departure(member))
        members.add_row(*_cells(*row))
    return Group(Panel(_cells(head or headline(status))[0]), shards, members)


def _cells(*values: str) -> list[Text]:
    # Plain text, not console markup, with controls escaped: ids and keys
    # come from the coordinator and may hold anything.
    return [Text(printable(value)) for value in values]


def plain_lines(status: GroupStatus) -> list[str]:
    """The same picture as plain ``key=value`` lines: one per shard and member."""
    lines = [headline(status)]
    for shard in status.shards:
        lines.append(
            f"shard {shard.shard.shard_index if shard.shard else '?'} "
            f"key={shard.stream_key} owner={_owners(shard).replace(', ', ',')} "
            f"length={shard.stream_length or 0} lag={_lag(shard)} "
            f"pending={shard.pending_count or 0}"
        )
    if not status.members:
        lines.append("no members")
    for member in status.members:
        gone = departure(member)
        lines.append(
            f"member {member.member_id} state={member.state.value if member.state else '?'} "
            f"epoch={member.member_epoch} shards={_assigned(member)}"
            + (f" ({gone})" if gone else "")
        )
    return [printable(line) for line in lines]
