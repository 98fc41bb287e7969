"""The eight Grafana endpoints over real HTTP, and the dashboard that uses them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as redis_asyncio

from streamkit.testing import RedisTarget
from streamkit_server.api import create_app
from streamkit_server.observability.metrics import Metrics
from streamkit_server.settings import ServerSettings

from ..sim import API, SimMember, create_group

DASHBOARD = Path(__file__).parents[3] / "deploy" / "grafana" / "streamkit-coordinator.json"
GRAFANA = f"{API}/monitoring/grafana"


def _panel_queries(dashboard: dict[str, Any]) -> tuple[list[str], list[str]]:
    exprs, paths = [], []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            exprs.extend([target["expr"]] if "expr" in target else [])
            paths.extend([target["urlPath"]] if "urlPath" in target else [])
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            paths.append(query["urlPath"])
    return exprs, paths


def test_every_dashboard_query_names_an_existing_metric_or_operation() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs, paths = _panel_queries(dashboard)
    assert exprs and paths
    exported: set[str] = set()
    for family in Metrics().registry.collect():
        exported |= {s.name for s in family.samples} | {family.name}
        exported.add(family.name + "_total")
    for expr in exprs:
        names = set(re.findall(r"\bredis_stream_coord_\w+", expr))
        assert names and names <= exported, (expr, names - exported)
    schema = create_app(ServerSettings(), admin_password="x", token_secret=b"x").openapi()
    served = {path for path, item in schema["paths"].items() if "get" in item}
    assert set(paths) <= served, set(paths) - served


async def test_grafana_rows_and_options_come_from_the_monitoring_data(
    coordinator_factory: Any, redis_url: str
) -> None:
    coord = coordinator_factory(RedisTarget(url=redis_url, cluster=False))
    async with httpx.AsyncClient(timeout=10) as http:
        await create_group(http, coord, "gr", "dash", 2)
        await SimMember(http, coord.url, "gr", "dash", "m1").heartbeat()
        await http.post(
            f"{coord.url}{API}/streams/gr", json={"requestedBy": "t"}, auth=coord.admin_auth
        )

        async def get(path: str, **params: str) -> Any:
            answer = await http.get(
                f"{coord.url}{GRAFANA}{path}", params=params, auth=coord.admin_auth
            )
            assert answer.status_code == 200, (path, answer.text)
            return answer.json()

        group = {"streamPrefix": "gr", "consumerGroup": "dash"}
        assert [r["consumerGroup"] for r in await get("/groups")] == ["dash"]
        assert await get("/options/streams") == [{"__text": "gr", "__value": "gr"}]
        assert await get("/options/consumer-groups", streamPrefix="gr") == [
            {"__text": "dash", "__value": "dash"}
        ]
        assert await get("/options/consumer-groups", streamPrefix="other") == []
        assert [o["__value"] for o in await get("/options/shards", **group)] == ["0", "1"]
        assert [m["memberId"] for m in await get("/members", **group)] == ["m1"]
        assert len(await get("/shards", **group)) == 2
        rows = await get("/assignments", **group)
        assert rows[0]["memberId"] == "m1" and set(rows[0]) >= {"targetShards", "currentShards"}
        assert await get("/messages", **group, shardIndex="ALL") == []
        redis = redis_asyncio.Redis.from_url(redis_url)
        for shard, count in ((0, 2), (1, 3)):
            for n in range(count):
                await redis.xadd(f"gr:{shard}", {"n": f"{shard}-{n}"})
        await redis.aclose()
        # ALL: the first ``limit`` rows in shard order, newest first per shard.
        every = await get("/messages", **group, shardIndex="ALL", limit="10")
        assert [r["fields"]["n"] for r in every] == ["0-1", "0-0", "1-2", "1-1", "1-0"]
        first = await get("/messages", **group, shardIndex="ALL", limit="3")
        assert [r["fields"]["n"] for r in first] == ["0-1", "0-0", "1-2"]
        # "¹" and "٣" are digits to str.isdigit() but not to int(): found by the fuzzer.
        for shard_index in ("x", "\u00b9", "\u0663", "-1"):
            bad = await http.get(
                f"{coord.url}{GRAFANA}/messages", params={**group, "shardIndex": shard_index},
                auth=coord.admin_auth,
            )  # fmt: skip
            assert bad.status_code == 400, (shard_index, bad.text)
            assert bad.json()["errorCode"] == "INVALID_REQUEST"
        missing = await http.get(f"{coord.url}{GRAFANA}/members", auth=coord.admin_auth)
        assert missing.status_code == 400
