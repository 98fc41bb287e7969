"""The autoscaling configurations in docs/operations.md and deploy/kubernetes/keda
point at the real endpoint and read real field names.

The KEDA block is the file, its URL is the route (with the orders sample's
stream, group and concurrency), and KEDA's ``valueLocation`` is read from a
real coordinator's answer; the HPA block validates against the Kubernetes
schemas and its recording rule names exported metrics.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import kubernetes_validate
import promql_parser
import yaml

from samples.orders import app as orders
from streamkit.testing import RedisTarget
from streamkit_server.api.autoscaling import PATH
from streamkit_server.observability.metrics import Metrics

from .test_kubernetes import K8S_VERSION, KUBE

ROOT = Path(__file__).parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"


def section(title: str) -> str:
    text = OPERATIONS.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    return text[start : text.index("\n## ", start + 1)]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", section("Autoscaling"), re.M | re.S)


def yaml_documents() -> list[dict[str, Any]]:
    return [d for block in blocks("yaml") for d in yaml.safe_load_all(block) if d]


def of_kind(kind: str) -> dict[str, Any]:
    (found,) = [d for d in yaml_documents() if d.get("kind") == kind]
    return found


def trigger() -> dict[str, Any]:
    (first,) = of_kind("ScaledObject")["spec"]["triggers"]
    return dict(first)


def test_the_docs_show_the_keda_file() -> None:
    shipped = list(yaml.safe_load_all((KUBE / "keda" / "scaledobject.yaml").read_text()))
    shown = [d for d in yaml_documents() if d.get("apiVersion", "").startswith("keda.sh/")]
    assert shown == shipped


def test_the_url_is_the_route_for_the_orders_sample() -> None:
    assert trigger()["type"] == "metrics-api"
    meta = trigger()["metadata"]
    url = urlsplit(meta["url"])
    (listener,) = [
        x for x in orders.app._listeners if (x.stream_prefix, x.consumer_group) == (
            orders.ORDERS, orders.BILLING)
    ]  # fmt: skip
    expected = PATH.format(streamPrefix=orders.ORDERS, consumerGroup=orders.BILLING)
    assert url.path == expected
    query = parse_qs(url.query)
    assert query["concurrency"] == [str(listener.concurrency)]
    assert int(query["targetLag"][0]) >= 1
    shards = orders.app._streams[orders.ORDERS][0]
    ceiling = math.ceil(shards / listener.concurrency)
    assert of_kind("ScaledObject")["spec"]["maxReplicaCount"] == ceiling
    # KEDA's metrics-api scaler with AverageValue 1: replicas = the value.
    assert trigger()["metricType"] == "AverageValue" and meta["targetValue"] == "1"
    assert meta["authMode"] == "basic"
    service = url.netloc.split(":")
    assert service == ["streamkit-coordinator", "8080"]


async def test_keda_reads_value_location_from_the_real_answer(
    coordinator: Any, any_redis: RedisTarget
) -> None:
    meta = trigger()["metadata"]
    url = urlsplit(meta["url"])
    prefix = f"autoscale-docs-{any_redis.cluster}"
    path = url.path.replace(f"/streams/{orders.ORDERS}/", f"/streams/{prefix}/")
    async with httpx.AsyncClient(timeout=10, auth=coordinator.admin_auth) as http:
        created = await http.post(
            f"{coordinator.url}/coord/v1/streams/{prefix}/groups/{orders.BILLING}",
            json={"initialShardCount": 8, "requestedBy": "test"},
        )
        assert created.status_code in (200, 201, 409), created.text
        answer = await http.get(f"{coordinator.url}{path}?{url.query}")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    # valueLocation is a GJSON path; this one is a top-level key.
    value = body[meta["valueLocation"]]
    assert isinstance(value, int) and 0 <= value <= body["maxUsefulReplicas"]
    # The JSON example in the docs has exactly the answer's fields.
    (example,) = blocks("json")
    shown = json.loads(example.replace(", ...]", "]"))
    assert set(shown) == set(body)
    assert set(shown["shards"][0]) == set(body["shards"][0])


def test_the_hpa_alternative_validates_and_its_rule_names_exported_metrics() -> None:
    hpa = of_kind("HorizontalPodAutoscaler")
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)
    (rules,) = [d for d in yaml_documents() if "groups" in d]
    (rule,) = rules["groups"][0]["rules"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == rule["record"]
    names: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.append(node.name)

    promql_parser.walk(promql_parser.parse(rule["expr"]), visit)
    exported = {family.name for family in Metrics().registry.collect()}
    assert names and set(names) <= exported, set(names) - exported
    # Same target lag and concurrency as the KEDA example.
    query = parse_qs(urlsplit(trigger()["metadata"]["url"]).query)
    assert f"/ {query['targetLag'][0]}" in rule["expr"]
    assert f"/ {query['concurrency'][0]})" in rule["expr"]
    assert hpa["spec"]["maxReplicas"] == of_kind("ScaledObject")["spec"]["maxReplicaCount"]
