"""The endpoint -> role matrix: the one place that says who may call what.

Keys are OpenAPI operation ids (and, for the routes outside the document,
their path).  ``None`` means public.  ``api.deps.authorize`` looks the
current route up here, and ``tests/server/auth/test_access_matrix.py`` walks every
route of the app against it; ``docs/operations.md`` shows the same table.
"""

from __future__ import annotations

from typing import Final

from streamkit_server.auth.security import Role

__all__ = ["PUBLIC_PATHS", "ROUTE_ROLES", "required_role"]

ROUTE_ROLES: Final[dict[str, Role | None]] = {
    # Authentication
    "loginCoordinatorApi": None,
    # Open on purpose: a dashboard asks "am I logged in?" (bad credentials: 401).
    "getMonitoringSession": None,
    # Admin mutations
    "createStreamGroup": Role.WRITE,
    "createCoordinatorGroup": Role.WRITE,
    "deleteCoordinatorGroup": Role.WRITE,
    "scaleStreamShards": Role.WRITE,
    "startGroupResharding": Role.WRITE,
    "rollbackReshardingMigration": Role.WRITE,
    "revokePrincipalTokens": Role.WRITE,
    "replayDeadLetter": Role.WRITE,
    "setStreamRetention": Role.WRITE,
    # Reads
    "getCoordinatorGroup": Role.READ,
    "getProducerRoutingMetadata": Role.READ,
    "getReshardingMigration": Role.READ,
    "getCoordinatorHealth": Role.READ,
    "getCoordinatorCompatibility": Role.READ,
    "listCoordinatorGroups": Role.READ,
    "getMonitoringGroup": Role.READ,
    "listGroupMembers": Role.READ,
    "getGroupAssignments": Role.READ,
    "getConsumptionProgress": Role.READ,
    "listReshardingMigrations": Role.READ,
    "getStreamShardOffsets": Role.READ,
    "getStreamShardMessages": Role.READ,
    "getGroupAutoscaling": Role.READ,
    "listDeadLetters": Role.READ,
    "getStreamRetention": Role.READ,
    "getApiPerformance": Role.READ,
    "listGrafanaGroups": Role.READ,
    "listGrafanaStreamOptions": Role.READ,
    "listGrafanaConsumerGroupOptions": Role.READ,
    "listGrafanaShardOptions": Role.READ,
    "listGrafanaMemberRows": Role.READ,
    "listGrafanaShardRows": Role.READ,
    "listGrafanaAssignmentRows": Role.READ,
    "listGrafanaMessageRows": Role.READ,
    # Its labels name streams and groups.
    "/metrics": Role.READ,
    # Consumers
    "sendConsumerHeartbeat": Role.MEMBER,
}

# Outside the OpenAPI document and the table: probes, the API docs and the
# web console's static files (its API calls are authenticated as above).
PUBLIC_PATHS: Final = ("/healthz", "/livez", "/readyz", "/docs", "/docs/oauth2-redirect",
                       "/openapi.json", "/console")  # fmt: skip


def required_role(key: str) -> Role | None:
    """The role ``key`` needs; a route missing from the table is refused (fail closed)."""
    try:
        return ROUTE_ROLES[key]
    except KeyError:
        raise LookupError(f"route {key!r} is not in the access matrix") from None
