"""OpenAPI links: which answer feeds which next call (stateful testing, docs).

Added to the generated document after FastAPI built it; they only annotate
success responses, so no operation, parameter or schema changes (the
operations stay those of ``coordinator.v1.yaml``).  Schemathesis's stateful
phase follows them: create a group, then read, heartbeat, scale and delete
*that* group instead of random names that would all be 404.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["LINKS", "add_links"]

_STREAM: Final = {"streamPrefix": "$request.path.streamPrefix"}
_GROUP: Final = {**_STREAM, "consumerGroup": "$request.path.consumerGroup"}
_FIRST_SHARD: Final = {**_GROUP, "shardIndex": 0}  # every group has shard 0
_MIGRATION: Final = {**_GROUP, "reshardingId": "$response.body#/reshardingId"}
_SAME_MIGRATION: Final = {**_GROUP, "reshardingId": "$request.path.reshardingId"}
_SAME_MEMBER: Final = {**_GROUP, "memberId": "$request.path.memberId"}

#: Reading a group, what can be done with it next.
_ON_A_GROUP: Final[dict[str, tuple[str, dict[str, Any]]]] = {
    "GetGroup": ("getCoordinatorGroup", _GROUP),
    "GetProducerRouting": ("getProducerRoutingMetadata", _GROUP),
    "SendHeartbeat": ("sendConsumerHeartbeat", _GROUP),
    "GetMonitoringGroup": ("getMonitoringGroup", _GROUP),
    "ListMembers": ("listGroupMembers", _GROUP),
    "GetAssignments": ("getGroupAssignments", _GROUP),
    "GetConsumption": ("getConsumptionProgress", _GROUP),
    "GetOffsets": ("getStreamShardOffsets", _GROUP),
    "ListMigrations": ("listReshardingMigrations", _GROUP),
    "GetMessages": ("getStreamShardMessages", _FIRST_SHARD),
    "ScaleGroup": ("startGroupResharding", _GROUP),
    "ScaleStream": ("scaleStreamShards", _STREAM),
    "DeleteGroup": ("deleteCoordinatorGroup", _GROUP),
}

#: (operationId, status) -> link name -> (target operationId, parameters).
LINKS: Final[dict[tuple[str, str], dict[str, tuple[str, dict[str, Any]]]]] = {
    ("createStreamGroup", "201"): {
        "CreateGroupOnStream": ("createCoordinatorGroup", _STREAM),
        "ScaleStream": ("scaleStreamShards", _STREAM),
    },
    ("createCoordinatorGroup", "201"): _ON_A_GROUP,
    ("getCoordinatorGroup", "200"): {
        name: _ON_A_GROUP[name] for name in ("SendHeartbeat", "ScaleGroup", "DeleteGroup")
    },
    ("sendConsumerHeartbeat", "200"): {
        # The same member id again (a rejoin, a stale epoch, a leave...).
        "NextHeartbeat": ("sendConsumerHeartbeat", _SAME_MEMBER),
        "ListMembers": ("listGroupMembers", _GROUP),
        "GetAssignments": ("getGroupAssignments", _GROUP),
        "DeleteGroup": ("deleteCoordinatorGroup", _GROUP),
    },
    ("startGroupResharding", "202"): {
        "GetMigration": ("getReshardingMigration", _MIGRATION),
        "RollbackMigration": ("rollbackReshardingMigration", _MIGRATION),
        "GetRouting": ("getProducerRoutingMetadata", _GROUP),
    },
    ("rollbackReshardingMigration", "202"): {
        "GetMigration": ("getReshardingMigration", _SAME_MIGRATION),
    },
}  # fmt: skip


def add_links(schema: dict[str, Any]) -> None:
    """Annotate the success responses of ``schema`` with ``LINKS`` (in place)."""
    operations = {
        op["operationId"]: op
        for item in schema.get("paths", {}).values()
        for op in item.values()
        if isinstance(op, dict) and "operationId" in op
    }
    for (source, status), links in LINKS.items():
        response = operations[source]["responses"][status]
        response["links"] = {
            name: {"operationId": target, "parameters": dict(params)}
            for name, (target, params) in links.items()
            if target in operations
        }
