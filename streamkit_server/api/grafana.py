"""``/coord/v1/monitoring/grafana/*``: the monitoring API as flat rows for Grafana.

Same data as the monitoring endpoints (each handler here calls one of them),
reshaped into what Grafana's JSON data sources want: arrays of flat objects
for table panels, ``{"__text", "__value"}`` rows for dashboard variables.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from streamkit.numerals import ascii_uint
from streamkit.protocol import API_PREFIX, StreamMessagePageDirection
from streamkit_server.api import monitoring
from streamkit_server.api.deps import AUTHORIZE, Caller, keys_for
from streamkit_server.errors import ApiError
from streamkit_server.store.keys import GroupKeys

router = APIRouter(
    prefix=f"{API_PREFIX}/monitoring/grafana", tags=["Grafana"], dependencies=[AUTHORIZE]
)

Prefix = Annotated[str, Query(alias="streamPrefix", min_length=1, max_length=200)]
GroupName = Annotated[str, Query(alias="consumerGroup", min_length=1, max_length=200)]


def _body(response: JSONResponse) -> Any:
    return json.loads(bytes(response.body))


def _options(values: list[str]) -> JSONResponse:
    return JSONResponse([{"__text": v, "__value": v} for v in values])


def _query_keys(request: Request, stream_prefix: Prefix, consumer_group: GroupName) -> GroupKeys:
    return keys_for(request, stream_prefix, consumer_group)


#: The group named by the ``streamPrefix`` and ``consumerGroup`` query parameters.
QueryKeys = Annotated[GroupKeys, Depends(_query_keys)]


async def _groups(request: Request, caller: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = _body(await monitoring.list_groups(request, caller))["groups"]
    return rows


@router.get("/groups", operation_id="listGrafanaGroups")
async def groups(request: Request, caller: Caller) -> JSONResponse:
    return JSONResponse(await _groups(request, caller))


@router.get("/options/streams", operation_id="listGrafanaStreamOptions")
async def stream_options(request: Request, caller: Caller) -> JSONResponse:
    rows = await _groups(request, caller)
    return _options(sorted({str(r["streamPrefix"]) for r in rows}))


@router.get("/options/consumer-groups", operation_id="listGrafanaConsumerGroupOptions")
async def group_options(
    request: Request,
    caller: Caller,
    stream_prefix: Annotated[str | None, Query(alias="streamPrefix", max_length=200)] = None,
) -> JSONResponse:
    rows = await _groups(request, caller)
    names = {str(r["consumerGroup"]) for r in rows if stream_prefix in (None, r["streamPrefix"])}
    return _options(sorted(names))


@router.get("/options/shards", operation_id="listGrafanaShardOptions")
async def shard_options(request: Request, caller: Caller, keys: QueryKeys) -> JSONResponse:
    group = await monitoring.load_group(request, keys)
    return _options([str(s) for s in sorted(group.known_shards())])


@router.get("/members", operation_id="listGrafanaMemberRows")
async def member_rows(request: Request, caller: Caller, keys: QueryKeys) -> JSONResponse:
    return JSONResponse(_body(await monitoring.members(request, keys, caller))["members"])


@router.get("/shards", operation_id="listGrafanaShardRows")
async def shard_rows(request: Request, caller: Caller, keys: QueryKeys) -> JSONResponse:
    return JSONResponse(_body(await monitoring.offsets(request, keys, caller))["shards"])


@router.get("/assignments", operation_id="listGrafanaAssignmentRows")
async def assignment_rows(request: Request, caller: Caller, keys: QueryKeys) -> JSONResponse:
    view = _body(await monitoring.assignments(request, keys, caller))
    rows = []
    members = set(view["targetAssignment"]) | set(view["currentAssignments"])
    for member in sorted(members):
        rows.append(
            {
                "memberId": member,
                "targetShards": view["targetAssignment"].get(member, []),
                "currentShards": view["currentAssignments"].get(member, []),
                "revokingShards": view["revokeProgress"].get(member, []),
            }
        )
    return JSONResponse(rows)


@router.get("/messages", operation_id="listGrafanaMessageRows")
async def message_rows(
    request: Request,
    caller: Caller,
    stream_prefix: Prefix,
    consumer_group: GroupName,
    shard_index: Annotated[str, Query(alias="shardIndex", max_length=16)] = "0",
    direction: StreamMessagePageDirection = StreamMessagePageDirection.BACKWARD,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 25,
) -> JSONResponse:
    keys = _query_keys(request, stream_prefix, consumer_group)
    if shard_index == "ALL":
        shards = sorted((await monitoring.load_group(request, keys)).known_shards())
    elif (shard := ascii_uint(shard_index, 2**31 - 1)) is not None:
        shards = [shard]
    else:
        raise ApiError(400, "INVALID_REQUEST", "shardIndex must be a shard number or ALL")
    rows: list[dict[str, Any]] = []
    for shard in shards:
        page = await monitoring.messages(request, keys, caller, shard, direction, cursor, limit)
        rows.extend(_body(page)["records"])
    return JSONResponse(rows[:limit] if shard_index == "ALL" else rows)
