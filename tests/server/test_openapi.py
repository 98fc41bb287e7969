"""``/openapi.json`` carries the reference's operationIds for every implemented operation."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

_ROOT = Path(__file__).resolve().parents[2]
_CANDIDATES = [
    _ROOT.parent / "shared" / "reference" / "coordinator.v1.yaml",
    _ROOT / "reference" / "coordinator.v1.yaml",
]
_METHODS = {"get", "post", "put", "delete", "patch"}
# A plain scalar with ": " inside (the reference has one) is quoted before retrying.
_PLAIN_WITH_COLON = re.compile(r"^(\s*[\w$-]+: )([^\"'|>{\[&*!#].*: .*)$")

IMPLEMENTED = {
    "loginCoordinatorApi", "createStreamGroup", "createCoordinatorGroup", "getCoordinatorGroup",
    "deleteCoordinatorGroup", "getProducerRoutingMetadata", "sendConsumerHeartbeat",
    "getMonitoringSession", "getCoordinatorHealth", "getCoordinatorCompatibility",
    "listCoordinatorGroups", "getMonitoringGroup", "listGroupMembers", "getGroupAssignments",
    "getConsumptionProgress", "listReshardingMigrations", "getStreamShardOffsets",
    "getStreamShardMessages", "scaleStreamShards", "startGroupResharding",
    "getReshardingMigration", "rollbackReshardingMigration",
    "listGrafanaGroups", "listGrafanaStreamOptions", "listGrafanaConsumerGroupOptions",
    "listGrafanaShardOptions", "listGrafanaMemberRows", "listGrafanaShardRows",
    "listGrafanaAssignmentRows", "listGrafanaMessageRows",
}  # fmt: skip


@cache
def _reference() -> dict[str, Any]:
    for path in _CANDIDATES:
        if path.is_file():
            text = path.read_text()
            try:
                loaded: dict[str, Any] = yaml.safe_load(text)
            except yaml.YAMLError:
                loaded = yaml.safe_load(
                    "\n".join(
                        f"{m[1]}{json.dumps(m[2])}"
                        if (m := _PLAIN_WITH_COLON.match(line))
                        else line
                        for line in text.splitlines()
                    )
                )
            return loaded
    pytest.fail("reference coordinator.v1.yaml not found next to the repository (../shared)")


def _operations(spec: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        op["operationId"]: (path, method)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in _METHODS
    }


async def test_openapi_operation_ids_match_the_reference(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    async with httpx.AsyncClient() as http:
        served = (await http.get(f"{coordinator.url}/openapi.json")).json()
    ours = _operations(served)
    reference = _operations(_reference())
    assert IMPLEMENTED <= set(reference)
    for operation_id in IMPLEMENTED:
        assert ours.get(operation_id) == reference[operation_id], operation_id
    # Nothing we serve under /coord/v1 uses an operationId the reference gives elsewhere.
    for operation_id, where in ours.items():
        if operation_id in reference:
            assert reference[operation_id] == where
    schemes = served["components"]["securitySchemes"]
    assert schemes["basicAuth"]["scheme"] == "basic" and schemes["bearerAuth"]["scheme"] == "bearer"
