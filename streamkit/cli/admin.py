"""``streamkit stream ...`` and ``streamkit group ...``: the coordinator's admin API.

Each command uses the ``STREAMKIT_COORDINATOR_*`` settings (creating, scaling
and deleting need the ``WRITE`` role, listing ``READ``), prints what changed
in one line per change, or with ``--json`` the coordinator's answer as one
JSON document.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from streamkit.cli.common import EXIT_FAILED, fail, load_settings, run_async
from streamkit.cli.output import echo, echo_json

if TYPE_CHECKING:
    from streamkit.admin import Audit
    from streamkit.coordinator_client import CoordinatorClient, CoordinatorError
    from streamkit.protocol import GroupResponse, WireModel

__all__ = ["group", "stream"]

T = TypeVar("T")
W = TypeVar("W", bound="WireModel")

stream = typer.Typer(
    name="stream",
    help="Create, list, scale and delete streams; set their retention.",
    no_args_is_help=True,
)
group = typer.Typer(
    name="group", help="Create, list and delete consumer groups.", no_args_is_help=True
)

_Stream = Annotated[str, typer.Argument(help="The stream prefix, e.g. 'orders'.")]
_Group = Annotated[str, typer.Argument(help="The consumer group, e.g. 'billing'.")]
_Json = Annotated[bool, typer.Option("--json", help="Print the answer as one JSON document.")]
_Reason = Annotated[str | None, typer.Option(help="Why, for the coordinator's audit log.")]
_Force = Annotated[
    bool,
    typer.Option(help="Delete even with live members (recovery only: they lose their group)."),
]
_MaxAge = Annotated[
    str | None,
    typer.Option(
        "--max-age",
        help="Retention by age: trim entries older than this (7d, 12h, 30m, 45s, 500ms), "
        "never before every group has read and acknowledged them.",
    ),
]
_MaxLength = Annotated[
    int | None,
    typer.Option(
        "--max-length",
        min=1,
        help="Retention by length: keep about this many entries per shard, never fewer "
        "than the groups still need.",
    ),
]
_Ordering = Annotated[
    str | None,
    typer.Option(help="'key' keeps per-key order across scales (docs/resharding.md), or 'none'."),
]


def _admin(
    what: str,
    work: Callable[[CoordinatorClient, Audit], Awaitable[T]],
    *,
    reason: str | None = None,
    role: str = "WRITE",
) -> T:
    """Run ``work(client, audit)``; a refusal becomes one ``error:`` line.

    ``audit`` names who runs the command (``requested_by``) and ``reason``.
    """
    from streamkit.admin import Audit, requested_by
    from streamkit.coordinator_client import CoordinatorClient, CoordinatorError

    settings = load_settings(quiet=True)

    async def call() -> T:
        async with CoordinatorClient.from_settings(settings) as client:
            who = requested_by(settings.coordinator_username)
            return await work(client, Audit(requested_by=who, reason=reason))

    try:
        return run_async(call)
    except CoordinatorError as exc:
        fail(_refusal(what, role, settings.coordinator_username, exc), _status(exc))


def _status(exc: CoordinatorError) -> int:
    # Credentials are configuration (2); a refused change is a failure (1).
    return 2 if exc.status_code in (401, 403) else EXIT_FAILED


def _refusal(what: str, role: str, username: str | None, exc: CoordinatorError) -> str:
    if exc.status_code == 403:
        who = f"principal {username!r}" if username else "client"
        return (
            f"{what} needs the {role} role, which the coordinator {who} lacks "
            "(STREAMKIT_COORDINATOR_USERNAME / STREAMKIT_COORDINATOR_PASSWORD name it)"
        )
    text = str(exc).replace("force=true", "--force")
    hint = _HINTS.get(exc.error_code or "", "")
    return f"{what}: {text}{hint}"


_HINTS = {
    "STREAM_ALREADY_EXISTS": " (`streamkit stream list` shows it; `streamkit stream scale` "
    "changes its shards)",
    "GROUP_ALREADY_EXISTS": " (`streamkit group list` shows it)",
    "SHARD_COUNT_MISMATCH": " (leave --shards out: a group takes its stream's shards)",
    "GROUP_NOT_FOUND": " (`streamkit group list` shows the groups)",
    "STREAM_NOT_FOUND": " (`streamkit stream create` makes it)",
    "INVALID_RETENTION": " (--max-age up to 3650d, --max-length 1 or more)",
}


def _print(as_json: bool, document: Any, lines: list[str]) -> None:
    if as_json:
        echo_json(document)
    else:
        for line in lines:
            echo(line)


def _change(
    what: str,
    work: Callable[[CoordinatorClient, Audit], Awaitable[W]],
    reason: str | None,
    as_json: bool,
    done: Callable[[W], str],
) -> None:
    """A one-request change: its answer as JSON, or the line ``done(answer)``."""
    answer = _admin(what, work, reason=reason)
    _print(as_json, answer.to_wire(), [done(answer)])


# -- streams -----------------------------------------------------------------------


@stream.command("create")
def stream_create(
    name: _Stream,
    shards: Annotated[
        int | None,
        typer.Option(min=1, help="Shard count (default: the coordinator's default, 4)."),
    ] = None,
    ordering: _Ordering = None,
    max_age: _MaxAge = None,
    max_length: _MaxLength = None,
    reason: _Reason = None,
    as_json: _Json = False,
) -> None:
    """Create a stream: its shard streams in Redis and its record on the coordinator."""
    from streamkit.admin import create_stream

    checked = _ordering(ordering)
    retention = _retention(max_age, max_length) if max_age or max_length else None
    _change(
        f"creating stream {name!r}",
        lambda client, audit: create_stream(
            client, name, shards, audit, ordering=checked, retention=retention
        ),
        reason,
        as_json,
        lambda created: f"created stream {name!r} with {created.shard_count} shards",
    )


@stream.command("list")
def stream_list(as_json: _Json = False) -> None:
    """List the streams that have consumer groups, with their shards and groups."""
    groups = _groups(None)
    streams: dict[str, dict[str, Any]] = {}
    for g in groups:
        entry = streams.setdefault(
            g.stream_prefix,
            {"streamPrefix": g.stream_prefix, "shardCount": g.shard_count, "groups": []},
        )
        entry["groups"].append(g.consumer_group)
        if g.active_migration is not None:
            entry["activeMigration"] = g.active_migration.to_wire()
    lines = [
        f"{s['streamPrefix']}  shards={s['shardCount']}  groups={','.join(s['groups'])}"
        + ("  (resharding)" if "activeMigration" in s else "")
        for s in streams.values()
    ] or ["no streams with groups"]
    _print(as_json, {"streams": list(streams.values())}, lines)


@stream.command("scale")
def stream_scale(
    name: _Stream,
    shards: Annotated[
        int, typer.Argument(min=0, help="The new shard count (0 drains all: --drain-all).")
    ],
    ordering: _Ordering = None,
    reason: _Reason = None,
    as_json: _Json = False,
    drain_all: Annotated[
        bool,
        typer.Option(help="Confirm a scale to 0: every shard drained, publishing refused."),
    ] = False,
) -> None:
    """Reshard a stream (every group of it moves): new shards first, old ones drained."""
    from streamkit.admin import scale_stream

    if shards == 0 and not drain_all:
        # One typo away from every publisher failing: ask for it explicitly.
        fail(
            f"scaling stream {name!r} to 0 shards drains every shard and leaves publishers "
            "no shard to write to until it is scaled up again; add --drain-all if that is "
            "what you want"
        )
    checked = _ordering(ordering)
    scaled = _admin(
        f"scaling stream {name!r}",
        lambda client, audit: scale_stream(client, name, shards, audit, ordering=checked),
        reason=reason or f"streamkit stream scale {name} {shards}",
    )
    groups = ", ".join(repr(g) for g in scaled.affected_consumer_groups)
    lines = [f"scaling stream {name!r} to {shards} shards (groups {groups})"]
    lines += [
        f"migration {m.resharding_id}: {m.from_shard_count} -> {m.to_shard_count} shards, "
        f"{m.state.value if m.state else '?'}"
        for m in scaled.migrations[:1]
    ]
    lines.append(f"`streamkit status {name} GROUP` shows its progress")
    _print(as_json, scaled.to_wire(), lines)


@stream.command("delete")
def stream_delete(
    name: _Stream, force: _Force = False, reason: _Reason = None, as_json: _Json = False
) -> None:
    """Delete every consumer group of a stream (its shard streams stay in Redis)."""
    from streamkit.admin import delete_group

    names = [g.consumer_group for g in _groups(name)]
    if not names:
        fail(f"stream {name!r} has no consumer groups (`streamkit stream list`)", EXIT_FAILED)

    async def work(client: CoordinatorClient, audit: Audit) -> list[str]:
        for group_name in names:
            await delete_group(client, name, group_name, audit, force=force)
        return names

    deleted = _admin(
        f"deleting the groups of stream {name!r}",
        work,
        reason=reason or f"streamkit stream delete {name}",
    )
    lines = [f"deleted group {g!r} of stream {name!r}" for g in deleted]
    lines.append(
        f"the shard streams {name}:* and their entries stay in Redis (the coordinator has no "
        f"stream delete); `streamkit group create {name} GROUP` uses them again"
    )
    _print(as_json, {"streamPrefix": name, "deletedGroups": deleted}, lines)


@stream.command("retention")
def stream_retention(
    name: _Stream,
    max_age: _MaxAge = None,
    max_length: _MaxLength = None,
    none: Annotated[
        bool,
        typer.Option("--none", help="No retention for this stream (even over the default)."),
    ] = False,
    reason: _Reason = None,
    as_json: _Json = False,
) -> None:
    """Show or set a stream's retention (trims only what every group has read and acked)."""
    from streamkit.admin import Retention, get_retention, set_retention

    if none and (max_age or max_length):
        fail("give --none or --max-age/--max-length, not both")
    if not none and not max_age and max_length is None:
        answer = _admin(
            f"reading the retention of stream {name!r}",
            lambda client, _audit: get_retention(client, name),
            role="READ",
        )
    else:
        retention = Retention() if none else _retention(max_age, max_length)
        answer = _admin(
            f"setting the retention of stream {name!r}",
            lambda client, audit: set_retention(client, name, retention, audit),
            reason=reason or f"streamkit stream retention {name}",
        )
    shown = _describe(answer.effective)
    where = {"stream": "its own", "default": "the coordinator's default", "none": "none set"}
    _print(
        as_json,
        answer.to_wire(),
        [f"stream {name!r}: retention {shown} ({where.get(answer.source, answer.source)})"],
    )


def _retention(max_age: str | None, max_length: int | None) -> Any:
    from streamkit.admin import Retention, parse_duration

    try:
        age = parse_duration(max_age) if max_age else None
    except ValueError as exc:
        fail(f"--max-age: {exc}")
    return Retention(max_age_ms=age, max_length=max_length)


def _describe(retention: Any) -> str:
    if retention is None or (retention.max_age_ms is None and retention.max_length is None):
        return "none"
    parts = []
    if retention.max_age_ms is not None:
        from streamkit.admin import format_duration

        parts.append(f"max age {format_duration(retention.max_age_ms)}")
    if retention.max_length is not None:
        parts.append(f"max length {retention.max_length}")
    return ", ".join(parts)


def _ordering(value: str | None) -> Any:
    if value not in (None, "none", "key"):
        fail(f"--ordering must be 'none' or 'key', got {value!r}")
    return value


# -- groups ------------------------------------------------------------------------


@group.command("create")
def group_create(
    stream_name: _Stream,
    name: _Group,
    shards: Annotated[
        int | None,
        typer.Option(min=1, help="Only for a new stream: its shard count (default 4)."),
    ] = None,
    reason: _Reason = None,
    as_json: _Json = False,
) -> None:
    """Create a consumer group on a stream (the stream too, if it is new)."""
    from streamkit.admin import create_group

    _change(
        f"creating group {name!r} of stream {stream_name!r}",
        lambda client, audit: create_group(client, stream_name, name, audit, shards),
        reason,
        as_json,
        lambda created: (
            f"created group {name!r} on stream {stream_name!r} ({created.shard_count} shards)"
        ),
    )


@group.command("list")
def group_list(
    stream_name: Annotated[
        str | None, typer.Argument(help="Only the groups of this stream.")
    ] = None,
    as_json: _Json = False,
) -> None:
    """List consumer groups: stream, group, state, shards, members holding shards."""
    groups = _groups(stream_name)
    lines = [
        f"{g.stream_prefix} {g.consumer_group}  state={g.state.value}  shards={g.shard_count}  "
        f"owners={len(g.current_assignment_summary)}"
        for g in groups
    ] or ["no consumer groups" + (f" on stream {stream_name!r}" if stream_name else "")]
    _print(as_json, {"groups": [g.to_wire() for g in groups]}, lines)


@group.command("delete")
def group_delete(
    stream_name: _Stream,
    name: _Group,
    force: _Force = False,
    reason: _Reason = None,
    as_json: _Json = False,
) -> None:
    """Delete a consumer group (refused while it has live members, unless --force)."""
    from streamkit.admin import delete_group

    _change(
        f"deleting group {name!r} of stream {stream_name!r}",
        lambda client, audit: delete_group(client, stream_name, name, audit, force=force),
        reason or f"streamkit group delete {stream_name} {name}",
        as_json,
        lambda _deleted: f"deleted group {name!r} of stream {stream_name!r}",
    )


def _groups(stream_name: str | None) -> list[GroupResponse]:
    """Every group (of ``stream_name``), sorted (role READ)."""

    async def work(client: CoordinatorClient, _audit: Audit) -> list[GroupResponse]:
        listing = await client.list_groups()
        return sorted(
            (g for g in listing.groups if stream_name in (None, g.stream_prefix)),
            key=lambda g: (g.stream_prefix, g.consumer_group),
        )

    return _admin("listing groups", work, role="READ")
