"""``/openapi.json`` carries the reference's operationIds for every implemented operation."""

from __future__ import annotations

from typing import Any

import httpx
from reference_contract import needs_reference, reference_contract

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

_METHODS = {"get", "post", "put", "delete", "patch"}

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


def _operations(spec: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        op["operationId"]: (path, method)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in _METHODS
    }


@needs_reference
async def test_openapi_operation_ids_match_the_reference(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    async with httpx.AsyncClient() as http:
        served = (await http.get(f"{coordinator.url}/openapi.json")).json()
    ours = _operations(served)
    reference = _operations(reference_contract())
    assert IMPLEMENTED <= set(reference)
    for operation_id in IMPLEMENTED:
        assert ours.get(operation_id) == reference[operation_id], operation_id
    # Nothing we serve under /coord/v1 uses an operationId the reference gives elsewhere.
    for operation_id, where in ours.items():
        if operation_id in reference:
            assert reference[operation_id] == where
    schemes = served["components"]["securitySchemes"]
    assert schemes["basicAuth"]["scheme"] == "basic" and schemes["bearerAuth"]["scheme"] == "bearer"
