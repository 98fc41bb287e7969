"""Create the streams and groups an app declares, at start-up.

Spring Kafka's ``NewTopic`` beans are the model: what is missing is created,
what exists is left alone.  It is safe when several processes start at once:
each create is one request the coordinator serialises per stream, and a
``409 ... ALREADY_EXISTS`` means another process was first, which is fine.

An existing stream with another shard count is never resharded here: a
reshard moves every group of the stream and is an operator's decision, so
the app logs what differs and the command that changes it, and goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from streamkit.admin import Audit, create_group, create_stream, is_conflict
from streamkit.coordinator_client import CoordinatorClient, CoordinatorError, CoordinatorUnavailable
from streamkit.declarations import StreamDeclaration
from streamkit.errors import StreamkitError
from streamkit.protocol import GroupResponse

__all__ = ["ProvisioningError", "StreamProvisioned", "provision"]

log = logging.getLogger("streamkit.provisioning")

_REFUSED = (401, 403)


class ProvisioningError(StreamkitError):
    """A declared stream or group is missing and could not be created."""


@dataclass
class StreamProvisioned:
    """What provisioning found and did for one declared stream."""

    stream_prefix: str
    created_stream: bool = False
    created_groups: list[str] = field(default_factory=list)
    #: The stream's shard count as a group of it reported (None: not known).
    shard_count: int | None = None


async def provision(
    client: CoordinatorClient,
    streams: Iterable[StreamDeclaration],
    *,
    requested_by: str,
    username: str | None = None,
) -> list[StreamProvisioned]:
    """Create what is missing of ``streams``; log what differs.

    ``username`` (the principal the client logs in as) names who lacks a role.
    Raises ``ProvisioningError`` when something that must be created cannot be.
    """
    done = []
    for declaration in streams:
        try:
            done.append(await _provision_one(client, declaration, requested_by, username))
        except CoordinatorUnavailable as exc:
            log.warning("cannot provision the declared streams now: %s", exc)
            break
    return done


async def _provision_one(
    client: CoordinatorClient, declared: StreamDeclaration, requested_by: str, username: str | None
) -> StreamProvisioned:
    prefix = declared.stream_prefix
    outcome = StreamProvisioned(prefix)
    found: dict[str, GroupResponse] = {}
    missing: list[str] = []
    unchecked = False  # a lookup was refused (no READ role): creating tells
    for group in declared.groups:
        try:
            found[group] = await client.get_group(prefix, group)
        except CoordinatorError as exc:
            if exc.status_code not in (404, *_REFUSED) or _wrong_credentials(exc, username):
                raise
            unchecked = unchecked or exc.status_code != 404
            missing.append(group)
    audit = Audit(requested_by=requested_by, reason="declared by the app")
    if missing or not declared.groups:
        try:
            await create_stream(client, prefix, declared.shards, audit)
            outcome.created_stream = True
        except CoordinatorError as exc:
            if exc.status_code in _REFUSED and unchecked:
                log.warning("%s", _cannot_check(declared, username, exc))
                return outcome
            if not is_conflict(exc, "STREAM_ALREADY_EXISTS"):
                raise _cannot_create(declared, None, username, exc) from None
    for group in missing:
        try:
            found[group] = await create_group(client, prefix, group, audit)
            outcome.created_groups.append(group)
        except CoordinatorError as exc:
            if not is_conflict(exc, "GROUP_ALREADY_EXISTS"):  # else: another process was first
                raise _cannot_create(declared, group, username, exc) from None
    counts = sorted({g.shard_count for g in found.values()})
    outcome.shard_count = counts[-1] if counts else None
    _log_outcome(declared, outcome)
    return outcome


def _log_outcome(declared: StreamDeclaration, outcome: StreamProvisioned) -> None:
    prefix = declared.stream_prefix
    groups = ", ".join(repr(g) for g in outcome.created_groups)
    if outcome.created_stream:
        count = outcome.shard_count or declared.shards
        shards = f" with {count} shards" if count else ""
        also = f" and group(s) {groups}" if groups else ""
        log.info("created stream %r%s%s", prefix, shards, also)
    elif groups:
        log.info("created group(s) %s on stream %r", groups, prefix)
    actual, wanted = outcome.shard_count, declared.shards
    if actual is not None and wanted is not None and actual != wanted:
        log.warning(
            "stream %r has %d shards, the app declares %d: not resharding it implicitly "
            "(every group of the stream moves); to change it run: streamkit stream scale %s %d",
            prefix,
            actual,
            wanted,
            prefix,
            wanted,
        )


def _commands(declared: StreamDeclaration, group: str | None) -> str:
    prefix = declared.stream_prefix
    shards = f" --shards {declared.shards}" if declared.shards else ""
    groups = [group] if group else list(declared.groups)
    steps = [f"streamkit stream create {prefix}{shards}"] if group is None else []
    steps += [f"streamkit group create {prefix} {g}" for g in groups]
    return " && ".join(steps)


def _wrong_credentials(exc: CoordinatorError, username: str | None) -> bool:
    """A user and password the coordinator refuses: nothing else will work either."""
    return exc.status_code in (401, 429) and username is not None


def _principal(username: str | None) -> str:
    return f"principal {username!r}" if username else "client (no credentials)"


def _cannot_create(
    declared: StreamDeclaration, group: str | None, username: str | None, exc: CoordinatorError
) -> ProvisioningError:
    what = f"group {group!r} of stream" if group else "stream"
    subject = f"{what} {declared.stream_prefix!r}"
    fix = f"or have an operator create it: {_commands(declared, group)}"
    if exc.status_code == 401:
        return ProvisioningError(
            f"{subject} is missing and the app cannot create it: the coordinator refused the "
            "credentials; set STREAMKIT_COORDINATOR_USERNAME and STREAMKIT_COORDINATOR_PASSWORD "
            f"to a principal with the WRITE role, {fix}"
        )
    if exc.status_code == 403:
        return ProvisioningError(
            f"{subject} is missing and creating it needs the WRITE role, which the coordinator "
            f"{_principal(username)} (STREAMKIT_COORDINATOR_USERNAME) lacks: give it WRITE, {fix}"
        )
    return ProvisioningError(f"cannot create {subject}: {exc}")


def _cannot_check(declared: StreamDeclaration, username: str | None, exc: CoordinatorError) -> str:
    why = (
        "refused the client's credentials, or their absence (401; "
        "STREAMKIT_COORDINATOR_USERNAME and _PASSWORD, or _TOKEN, set them)"
        if exc.status_code == 401
        else f"{_principal(username)} has neither the READ nor the WRITE role ({exc.status_code})"
    )
    return (
        f"cannot check or create the declared stream {declared.stream_prefix!r}: the coordinator "
        f"{why}; assuming it exists (the members' first heartbeat tells)"
    )
