"""The coordinator's admin calls (role ``WRITE``): create, scale and delete.

Used by ``streamkit stream|group ...`` and by the provisioning of declared
streams at start-up.  Each is one request over the app's (or the command's)
``CoordinatorClient``; errors are its ``CoordinatorError`` with the status
and ``errorCode`` the coordinator answered.
"""

from __future__ import annotations

import getpass
import socket
from typing import Literal, TypedDict
from urllib.parse import quote

from streamkit.coordinator_client import CoordinatorClient, CoordinatorError
from streamkit.protocol import (
    API_PREFIX,
    CreateGroupRequest,
    CreateStreamRequest,
    DeleteGroupRequest,
    GroupResponse,
    ScaleStreamRequest,
    StreamCreateResponse,
    StreamScaleResponse,
    WireModel,
)
from streamkit.protocol.durations import format_duration, parse_duration

__all__ = [
    "Audit",
    "Ordering",
    "Retention",
    "RetentionAnswer",
    "create_group",
    "create_stream",
    "delete_group",
    "format_duration",
    "get_retention",
    "is_conflict",
    "parse_duration",
    "requested_by",
    "scale_stream",
    "set_retention",
]

#: streamkit's extension of the create and scale requests (docs/resharding.md).
Ordering = Literal["none", "key"]


class Retention(WireModel):
    """streamkit's retention of a stream (docs/operations.md#retention): both None is none."""

    max_age_ms: int | None = None
    max_length: int | None = None


class RetentionAnswer(WireModel):
    """``getStreamRetention`` / ``setStreamRetention``: the stream's own, and what applies."""

    stream_prefix: str
    retention: Retention | None = None
    effective: Retention | None = None
    #: 'stream' (its own), 'default' (the coordinator's) or 'none'.
    source: str


class Audit(TypedDict):
    """Who asks for a change and why: the coordinator's audit log keeps both.

    Spread into each change's request body (``**audit``).  Deleting and
    scaling need a ``reason`` (the coordinator refuses one without); creating
    and setting a retention do not.
    """

    requested_by: str
    reason: str | None


class _SetRetention(Retention):
    requested_by: str
    reason: str | None = None


class _CreateStream(CreateStreamRequest):
    ordering: Ordering | None = None
    retention: Retention | None = None


class _ScaleStream(ScaleStreamRequest):
    ordering: Ordering | None = None


def requested_by(username: str | None = None) -> str:
    """Who the audit log names: the coordinator principal, and who ran it where."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container with an arbitrary uid)
        user = "unknown"
    where = f"{user}@{socket.gethostname()}"
    return f"{username} ({where})" if username else where


def _stream_path(stream_prefix: str, *rest: str) -> str:
    return "/".join((f"{API_PREFIX}/streams/{quote(stream_prefix, safe='')}", *rest))


async def create_stream(
    client: CoordinatorClient,
    stream_prefix: str,
    shards: int | None,
    audit: Audit,
    *,
    ordering: Ordering | None = None,
    retention: Retention | None = None,
) -> StreamCreateResponse:
    """``createStreamGroup``: 201, or ``CoordinatorError`` 409 ``STREAM_ALREADY_EXISTS``."""
    body = _CreateStream(
        initial_shard_count=shards, ordering=ordering, retention=retention, **audit
    )
    return await client._call("POST", _stream_path(stream_prefix), StreamCreateResponse, body=body)


async def create_group(
    client: CoordinatorClient,
    stream_prefix: str,
    group: str,
    audit: Audit,
    shards: int | None = None,
) -> GroupResponse:
    """``createCoordinatorGroup``: 201, or 409 ``GROUP_ALREADY_EXISTS``.

    Without ``shards`` the group takes the stream's shards (or the
    coordinator's default for a new stream).
    """
    body = CreateGroupRequest(initial_shard_count=shards, **audit)
    return await _group_call(client, "POST", stream_prefix, group, body)


async def delete_group(
    client: CoordinatorClient, stream_prefix: str, group: str, audit: Audit, *, force: bool = False
) -> GroupResponse:
    """``deleteCoordinatorGroup``: the group as it was; 422 while it has members."""
    body = DeleteGroupRequest(force=force, **audit)
    return await _group_call(client, "DELETE", stream_prefix, group, body)


async def _group_call(
    client: CoordinatorClient, method: str, stream_prefix: str, group: str, body: WireModel
) -> GroupResponse:
    path = client.group_path(stream_prefix, group)
    return await client._call(method, path, GroupResponse, body=body)


async def scale_stream(
    client: CoordinatorClient,
    stream_prefix: str,
    shards: int,
    audit: Audit,
    *,
    ordering: Ordering | None = None,
) -> StreamScaleResponse:
    """``scaleStreamShards``: 202 with one migration per group."""
    body = _ScaleStream(target_shard_count=shards, ordering=ordering, **audit)
    path = _stream_path(stream_prefix, "scale")
    return await client._call("POST", path, StreamScaleResponse, body=body)


async def get_retention(client: CoordinatorClient, stream_prefix: str) -> RetentionAnswer:
    """``getStreamRetention`` (role ``READ``): 404 ``STREAM_NOT_FOUND`` for an unknown stream."""
    path = _stream_path(stream_prefix, "retention")
    return await client._call("GET", path, RetentionAnswer)


async def set_retention(
    client: CoordinatorClient, stream_prefix: str, retention: Retention, audit: Audit
) -> RetentionAnswer:
    """``setStreamRetention``: the stream's retention from now on (both None: none)."""
    body = _SetRetention(**retention.model_dump(), **audit)
    path = _stream_path(stream_prefix, "retention")
    return await client._call("PUT", path, RetentionAnswer, body=body)


def is_conflict(exc: CoordinatorError, *codes: str) -> bool:
    """A 409 with one of ``codes`` (any 409 without codes)."""
    return exc.status_code == 409 and (not codes or exc.error_code in codes)
