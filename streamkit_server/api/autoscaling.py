"""``getGroupAutoscaling``: the autoscaling signal of one group (role READ).

Shaped for KEDA's ``metrics-api`` scaler: ``valueLocation: recommendedReplicas``
with ``targetValue: "1"`` makes KEDA ask for exactly the recommended number of
consumer processes (see docs/operations.md#autoscaling).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from streamkit.protocol import API_PREFIX
from streamkit_server.api.deps import AUTHORIZE, Caller, group_keys, runtime
from streamkit_server.api.errors import documented
from streamkit_server.coordination.autoscaling import LagSampler
from streamkit_server.core.autoscaling import MAX_CONCURRENCY, MAX_TARGET_LAG, recommend
from streamkit_server.store.keys import GroupKeys

__all__ = ["OPERATION_ID", "PATH", "router", "sampler"]

OPERATION_ID = "getGroupAutoscaling"
PATH = f"{API_PREFIX}/monitoring/streams/{{streamPrefix}}/groups/{{consumerGroup}}/autoscaling"

router = APIRouter(tags=["Monitoring"], dependencies=[AUTHORIZE])


def sampler(request: Request) -> LagSampler:
    """The process's sampler (made by the app's lifespan, see api/app.py)."""
    found: LagSampler = request.app.state.lag_sampler
    return found


@router.get(
    PATH,
    operation_id=OPERATION_ID,
    responses=documented({400: "Invalid names or parameters.", 404: "Group not found."}),
)
async def autoscaling(
    request: Request,
    keys: Annotated[GroupKeys, Depends(group_keys)],
    _p: Caller,
    concurrency: Annotated[
        int,
        Query(ge=1, le=MAX_CONCURRENCY, description="Members (listener concurrency) per process."),
    ],
    targetLag: Annotated[
        int,
        Query(
            ge=1,
            le=MAX_TARGET_LAG,
            description="Backlog (lag + pending entries) one process should be left with.",
        ),
    ],
) -> JSONResponse:
    group = await runtime(request).service.read_group(keys)
    window = await sampler(request).sample(group)
    advice = recommend(window, group.shard_count, concurrency, targetLag)
    left, rate = advice.backlog, advice.throughput
    now = window[-1]
    body: dict[str, Any] = {
        "streamPrefix": group.stream_prefix,
        "consumerGroup": group.consumer_group,
        "recommendedReplicas": advice.recommended_replicas,
        "maxUsefulReplicas": advice.max_useful_replicas,
        "concurrency": concurrency,
        "targetLag": targetLag,
        "shardCount": group.shard_count,
        "liveMembers": len(group.live_member_ids()),
        "totalLag": left.lag,
        "totalPending": left.pending,
        "backlog": left.total,
        "lagUnknownShards": list(left.lag_unknown_shards),
        "handledPerSecond": None if rate.per_second is None else round(rate.per_second, 3),
        "windowSeconds": round(rate.window_seconds, 3),
        "sampledAtMs": now.at_ms,
        "shards": [{"shardIndex": s.shard, "lag": s.lag, "pending": s.pending} for s in now.shards],
    }
    return JSONResponse(body)
