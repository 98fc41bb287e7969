"""Monitoring endpoints (operators and dashboards); all need the READ role."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from fastapi.types import DecoratedCallable
from redis.exceptions import ResponseError

from streamkit.protocol import (
    API_PREFIX,
    PROTOCOL_VERSION,
    SUPPORTED_PROTOCOL_VERSIONS,
    AssignmentsResponse,
    ConsumptionProgressResponse,
    GroupListResponse,
    GroupResponse,
    HealthResponse,
    MemberListResponse,
    MigrationsResponse,
    MonitoringSessionResponse,
    StreamMessagePageDirection,
    StreamMessageRecord,
    StreamMessagesPageResponse,
    StreamShardOffsetsResponse,
    shard_ids,
)
from streamkit.routing import stream_key
from streamkit.version import package_version
from streamkit_server.api.deps import AUTHORIZE, Caller, group_keys, runtime
from streamkit_server.api.errors import documented, is_command_refusal
from streamkit_server.auth.security import Principal
from streamkit_server.coordination import views
from streamkit_server.coordination.executor import now_ms
from streamkit_server.core import LAYOUT_VERSION, SCHEMA_VERSION, GroupMetadata
from streamkit_server.errors import ApiError
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.records import RedisClient

router = APIRouter(prefix=f"{API_PREFIX}/monitoring", tags=["Monitoring"], dependencies=[AUTHORIZE])

Keys = Annotated[GroupKeys, Depends(group_keys)]
_GROUP = "/streams/{streamPrefix}/groups/{consumerGroup}"
_NOT_FOUND = documented({404: "Group not found."})
_CURSOR = re.compile(r"^(\d{1,20})-(\d{1,20})$")
_UINT64_MAX = 2**64 - 1
# Shards per pipeline of the offsets view (three commands each).
_FACTS_PER_PIPELINE = 256


def parse_record_id(value: str, error_code: str, name: str) -> tuple[int, int]:
    """A stream record id; Redis refuses parts above uint64, so they are 400 here."""
    match = _CURSOR.match(value)
    if match is None or any(int(part) > _UINT64_MAX for part in match.groups()):
        raise ApiError(
            400,
            error_code,
            f"{name} must be a stream record id <ms>-<seq> (each 0..{_UINT64_MAX}), "
            "like 1700000000-0",
        )
    return int(match[1]), int(match[2])


def _parse_cursor(cursor: str) -> tuple[int, int]:
    return parse_record_id(cursor, "INVALID_CURSOR", "cursor")


def _json(model: Any) -> JSONResponse:
    return JSONResponse(model.to_wire())


def _group_view(
    suffix: str, operation_id: str, model: type[Any]
) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """``GET`` of one view of a group (``404`` while the group does not exist)."""
    return router.get(
        f"{_GROUP}{suffix}", operation_id=operation_id, response_model=model, responses=_NOT_FOUND
    )


async def load_group(request: Request, keys: GroupKeys) -> GroupMetadata:
    return await runtime(request).service.read_group(keys)


@router.get(
    "/session", operation_id="getMonitoringSession", response_model=MonitoringSessionResponse
)
async def session(request: Request) -> JSONResponse:
    # Open on purpose: a dashboard asks "am I logged in?"; bad credentials are
    # still a 401 so a wrong password is not mistaken for "anonymous".
    principal: Principal | None = getattr(request.state, "principal", None)
    return _json(
        MonitoringSessionResponse(
            authenticated=principal is not None,
            username=principal.username if principal is not None else None,
        )
    )


@router.get("/health", operation_id="getCoordinatorHealth", response_model=HealthResponse)
async def health(request: Request, _p: Caller) -> JSONResponse:
    return _json(await runtime(request).health())


@router.get("/compatibility", operation_id="getCoordinatorCompatibility")
async def compatibility(request: Request, _p: Caller) -> JSONResponse:
    versions = list(SUPPORTED_PROTOCOL_VERSIONS)
    return JSONResponse(
        {
            # The reference's fields: the coordination (protocol) version
            # range with each version's release lifecycle.
            "currentCoordinationVersion": PROTOCOL_VERSION,
            "supportedCoordinationVersions": {"min": min(versions), "max": max(versions)},
            "coordinationVersions": [
                {"version": v, "lifecycle": "CURRENT" if v == PROTOCOL_VERSION else "SUPPORTED"}
                for v in versions
            ],
            # streamkit's own, beside them.
            "serverVersion": package_version(),
            "protocolVersion": PROTOCOL_VERSION,
            "minProtocolVersion": min(versions),
            "maxProtocolVersion": max(versions),
            "supportedProtocolVersions": versions,
            "metadataSchemaVersion": SCHEMA_VERSION,
            "metadataLayoutVersion": LAYOUT_VERSION,
            "apiPrefix": API_PREFIX,
        }
    )


@router.get("/groups", operation_id="listCoordinatorGroups", response_model=GroupListResponse)
async def list_groups(request: Request, _p: Caller) -> JSONResponse:
    groups = await runtime(request).service.list_groups()
    return _json(GroupListResponse(groups=[views.group_response(g) for g in groups]))


@_group_view("", "getMonitoringGroup", GroupResponse)
async def get_group(request: Request, keys: Keys, _p: Caller) -> JSONResponse:
    return _json(views.group_response(await load_group(request, keys)))


@_group_view("/members", "listGroupMembers", MemberListResponse)
async def members(request: Request, keys: Keys, _p: Caller) -> JSONResponse:
    group = await load_group(request, keys)
    return _json(MemberListResponse(members=views.member_views(group, now_ms())))


@_group_view("/assignments", "getGroupAssignments", AssignmentsResponse)
async def assignments(request: Request, keys: Keys, _p: Caller) -> JSONResponse:
    return _json(views.assignments(await load_group(request, keys)))


@_group_view("/consumption", "getConsumptionProgress", ConsumptionProgressResponse)
async def consumption(request: Request, keys: Keys, _p: Caller) -> JSONResponse:
    return _json(views.consumption(await load_group(request, keys)))


@_group_view("/migrations", "listReshardingMigrations", MigrationsResponse)
async def migrations(request: Request, keys: Keys, _p: Caller) -> JSONResponse:
    return JSONResponse(views.migrations(await load_group(request, keys)))


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _node_endpoint(client: RedisClient, key: str) -> str | None:
    if hasattr(client, "get_node_from_key"):
        node = client.get_node_from_key(key)
        return f"{node.host}:{node.port}" if node is not None else None
    kwargs = client.connection_pool.connection_kwargs
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


async def _shard_facts(
    client: RedisClient, group: GroupMetadata, shards: list[int]
) -> list[views.ShardFacts]:
    """What Redis says of each shard's stream, pipelined: a 4,096-shard group
    is a few round trips (a cluster pipeline splits by node), not 12,000."""
    out: list[views.ShardFacts] = []
    for lo in range(0, len(shards), _FACTS_PER_PIPELINE):
        part = shards[lo : lo + _FACTS_PER_PIPELINE]
        pipe = client.pipeline(transaction=False)
        for shard in part:
            key = stream_key(group.stream_prefix, shard)
            pipe.xinfo_stream(key)
            pipe.xinfo_groups(key)
            pipe.memory_usage(key)
        replies = await pipe.execute(raise_on_error=False)
        for n, shard in enumerate(part):
            info, groups, memory = replies[3 * n : 3 * n + 3]
            out.append(_facts(client, group, shard, info, groups, memory))
    return out


def _facts(
    client: RedisClient, group: GroupMetadata, shard: int, info: Any, groups: Any, memory: Any
) -> views.ShardFacts:
    key = stream_key(group.stream_prefix, shard)
    for reply in (info, groups, memory):
        # No such key is a retired or deleted shard; XINFO denied is not.
        if isinstance(reply, Exception) and (
            not isinstance(reply, ResponseError) or is_command_refusal(reply)
        ):
            raise reply
    if isinstance(info, Exception):
        return views.ShardFacts(shard, False, 0, None, None, None, None, None, None,
                                _node_endpoint(client, key))  # fmt: skip
    first, last = info.get("first-entry"), info.get("last-entry")
    delivered = pending = lag = None
    for entry in groups if not isinstance(groups, Exception) else []:
        if _text(entry.get("name")) == group.consumer_group:
            delivered = _text(entry.get("last-delivered-id"))
            pending = int(entry.get("pending") or 0)
            raw_lag = entry.get("lag")
            lag = int(raw_lag) if raw_lag is not None else None
    return views.ShardFacts(
        shard=shard,
        exists=True,
        length=int(info.get("length") or 0),
        first_id=_text(first[0]) if first else None,
        last_id=_text(last[0]) if last else None,
        group_last_delivered_id=delivered,
        group_pending=pending,
        group_lag=lag,
        memory_bytes=int(memory) if isinstance(memory, int | str | bytes) else None,
        node_endpoint=_node_endpoint(client, key),
    )


@_group_view("/offsets", "getStreamShardOffsets", StreamShardOffsetsResponse)
async def offsets(request: Request, keys: Keys, _p: Caller) -> JSONResponse:
    group = await load_group(request, keys)
    # Every stream the group still has: the layout, removed shards not yet
    # retired, and (ordered reshard) new shards not yet readable.
    facts = await _shard_facts(runtime(request).client, group, sorted(group.known_shards()))
    return _json(views.shard_offsets(group, facts))


@_group_view("/shards/{shardIndex}/messages", "getStreamShardMessages", StreamMessagesPageResponse)
async def messages(
    request: Request,
    keys: Keys,
    _p: Caller,
    shardIndex: Annotated[int, Path(ge=0, le=2**31 - 1)],
    direction: StreamMessagePageDirection = StreamMessagePageDirection.BACKWARD,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 25,
) -> JSONResponse:
    # Checked before anything is loaded: bad input is a 400 whatever exists.
    position = _parse_cursor(cursor) if cursor is not None else None
    group = await load_group(request, keys)
    if shardIndex not in group.known_shards():
        raise ApiError(
            404, "SHARD_NOT_FOUND", f"shard {shardIndex} is not a shard of this group "
            f"(layout={group.layout}, draining={group.draining_shards})",
        )  # fmt: skip
    key = stream_key(group.stream_prefix, shardIndex)
    client = runtime(request).client
    forward = direction is StreamMessagePageDirection.FORWARD
    # One extra record tells whether there is a next page.
    rows: Any = []
    if position is None:
        if forward:
            rows = await client.xrange(key, "-", "+", count=limit + 1)
        else:
            rows = await client.xrevrange(key, "+", "-", count=limit + 1)
    # Nothing lies beyond the last possible id (Redis refuses an exclusive
    # range that starts there).
    elif forward and position != (_UINT64_MAX, _UINT64_MAX):
        rows = await client.xrange(key, f"({cursor}", "+", count=limit + 1)
    elif not forward and position != (0, 0):
        rows = await client.xrevrange(key, f"({cursor}", "-", count=limit + 1)
    rows = list(rows or [])
    more = len(rows) > limit
    rows = rows[:limit]
    shard = shard_ids([shardIndex])[0]
    records = []
    for record_id, fields in rows:
        decoded = {_text(k): _text(v) for k, v in (fields or {}).items()}
        records.append(
            StreamMessageRecord(
                shard=shard,
                stream_key=key,
                record_id=_text(record_id),
                fields=decoded,
                payload=decoded.get("payload"),
            )
        )
    page = StreamMessagesPageResponse(
        stream_prefix=group.stream_prefix,
        consumer_group=group.consumer_group,
        shard=shard,
        stream_key=key,
        direction=direction,
        limit=limit,
        records=records,
        next_cursor=records[-1].record_id if more and records else None,
    )
    return _json(page)
