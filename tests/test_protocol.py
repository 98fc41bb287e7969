"""Tests for streamkit.protocol: the wire models against the reference contract.

The contract checks read ``coordinator.v1.yaml`` and compare it with the
models generically (field names, required lists, types, formats, minimums,
nullability, enum values), so a schema change in the reference shows up here
as a failing test rather than as a silent wire incompatibility.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from reference_contract import MISSING_REASON, reference_contract

from streamkit import protocol
from streamkit.protocol import (
    API_PREFIX,
    PROTOCOL_VERSION,
    SUPPORTED_PROTOCOL_VERSIONS,
    AssignmentView,
    DeleteGroupRequest,
    GrafanaOptionRow,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatStatus,
    MemberView,
    RevokingShardState,
    ShardId,
    StreamShardOffset,
    WireModel,
    shard_ids,
    shard_indexes,
)

# --------------------------------------------------------------------------
# The reference contract
# --------------------------------------------------------------------------

# Schema names whose Python class is named differently (the server already has
# an internal MemberMetadata aggregate).
_CLASS_NAME_OVERRIDES = {"MemberMetadata": "MemberView"}

# Deliberate, documented deviations from the contract's ``required`` lists:
# a ShardId without an index is meaningless (see ShardId's docstring).
_EXTRA_REQUIRED = {"ShardId": {"shardIndex"}}
# Optional fields streamkit adds to a contract schema (the reference ignores
# unknown fields): see docs/consumer.md "Member ids".
_EXTENSIONS = {
    "HeartbeatRequest": {"incarnation"},
    "HealthResponse": set(protocol.HEALTH_EXTENSIONS),
}

# Inline response schemas of the contract, keyed by operationId.
_INLINE_WRAPPERS = {
    "listCoordinatorGroups": protocol.GroupListResponse,
    "listGroupMembers": protocol.MemberListResponse,
}


def _spec() -> dict[str, Any]:
    return reference_contract()


def _schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = _spec()["components"]["schemas"]
    return schemas


def _object_schema_names() -> list[str]:
    return [name for name, s in _schemas().items() if "properties" in s]


def _enum_schema_names() -> list[str]:
    return [name for name, s in _schemas().items() if "enum" in s]


def _model_for(schema_name: str) -> type[WireModel]:
    cls: object = getattr(protocol, _CLASS_NAME_OVERRIDES.get(schema_name, schema_name))
    assert isinstance(cls, type)
    assert issubclass(cls, WireModel)
    return cls


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    resolved: dict[str, Any] = _schemas()[ref.rsplit("/", 1)[-1]]
    return resolved


def _aliases(model: type[WireModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def _required_aliases(model: type[WireModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items() if info.is_required()}


def _operation(operation_id: str) -> dict[str, Any]:
    for path_item in _spec()["paths"].values():
        for operation in path_item.values():
            if isinstance(operation, dict) and operation.get("operationId") == operation_id:
                return operation
    raise AssertionError(f"operationId {operation_id} not in the contract")


# Schema names are needed at collection time for parametrize; a missing
# contract turns into one case instead of a collection error, which then
# skips (a clone without ../shared) or fails (a broken layout) with the reason.
def _collect(names: Callable[[], list[str]]) -> list[Any]:
    try:
        return names()
    except pytest.skip.Exception:
        return [pytest.param("<contract missing>", marks=pytest.mark.skip(reason=MISSING_REASON))]
    except pytest.fail.Exception:
        return ["<contract missing>"]


OBJECT_SCHEMAS = _collect(_object_schema_names)
ENUM_SCHEMAS = _collect(_enum_schema_names)


# --------------------------------------------------------------------------
# Contract shape: names, required lists, types, constraints
# --------------------------------------------------------------------------


def test_every_schema_has_a_model_or_enum() -> None:
    exported = set(protocol.__all__)
    for name, schema in _schemas().items():
        if "properties" in schema or "enum" in schema:
            assert _CLASS_NAME_OVERRIDES.get(name, name) in exported, name
        else:
            # Only the free-form Grafana*Row objects have neither.
            assert schema.get("additionalProperties") is True, name


@pytest.mark.parametrize("schema_name", OBJECT_SCHEMAS)
def test_field_names_match_contract(schema_name: str) -> None:
    schema = _schemas()[schema_name]
    extensions = _EXTENSIONS.get(schema_name, set())
    assert _aliases(_model_for(schema_name)) == set(schema["properties"]) | extensions
    assert not extensions & set(_required_aliases(_model_for(schema_name)))


@pytest.mark.parametrize("schema_name", OBJECT_SCHEMAS)
def test_required_fields_match_contract(schema_name: str) -> None:
    schema = _schemas()[schema_name]
    expected = set(schema.get("required", [])) | _EXTRA_REQUIRED.get(schema_name, set())
    assert _required_aliases(_model_for(schema_name)) == expected


def test_member_view_keeps_contract_title() -> None:
    assert MemberView.model_json_schema()["title"] == "MemberMetadata"


@pytest.mark.parametrize("operation_id", sorted(_INLINE_WRAPPERS))
def test_inline_response_wrappers_match_contract(operation_id: str) -> None:
    schema = _operation(operation_id)["responses"]["200"]["content"]["application/json"]["schema"]
    assert _aliases(_INLINE_WRAPPERS[operation_id]) == set(schema["properties"])


def _model_kinds(prop: dict[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """Non-null JSON types of a model property and its non-null branch."""
    branches = prop.get("anyOf", [prop])
    kinds: set[str] = set()
    main: dict[str, Any] = {}
    for branch in branches:
        if branch.get("type") == "null":
            kinds.add("null")
            continue
        main = branch
        kinds.add("ref" if "$ref" in branch else branch["type"])
    return kinds, main


def _yaml_kind(prop: dict[str, Any]) -> tuple[str, bool]:
    """JSON type of a contract property (``ref`` for schema refs) and its nullability."""
    if "oneOf" in prop:
        non_null = [p for p in prop["oneOf"] if p.get("type") != "null"]
        assert len(non_null) == 1
        return _yaml_kind(non_null[0])[0], len(non_null) != len(prop["oneOf"])
    if "$ref" in prop:
        return "ref", False
    return prop["type"], bool(prop.get("nullable"))


@pytest.mark.parametrize("schema_name", OBJECT_SCHEMAS)
def test_types_formats_and_constraints_match_contract(schema_name: str) -> None:
    model_schema = _model_for(schema_name).model_json_schema(by_alias=True)
    for name, prop in _schemas()[schema_name]["properties"].items():
        kinds, main = _model_kinds(model_schema["properties"][name])
        yaml_kind, nullable = _yaml_kind(prop)
        where = f"{schema_name}.{name}"
        assert kinds - {"null"} == {yaml_kind}, where
        if nullable:
            assert "null" in kinds, f"{where} must accept null"
        if "format" in prop:
            assert main.get("format") == prop["format"], where
        if "minimum" in prop:
            assert main.get("minimum") == prop["minimum"], where
        if prop.get("uniqueItems"):
            assert main.get("uniqueItems") is True, where
        if yaml_kind == "array":
            item_kind, _ = _yaml_kind(prop["items"])
            model_items = main["items"]
            assert ("ref" if "$ref" in model_items else model_items["type"]) == item_kind, where


@pytest.mark.parametrize("schema_name", ENUM_SCHEMAS)
def test_enum_values_match_contract(schema_name: str) -> None:
    enum_cls = getattr(protocol, schema_name)
    assert [member.value for member in enum_cls] == _schemas()[schema_name]["enum"]


# --------------------------------------------------------------------------
# Round trips driven by the contract
# --------------------------------------------------------------------------


def _sample(schema: dict[str, Any], counter: Iterator[int]) -> Any:
    """A fully populated JSON value valid for ``schema``.

    Integers come from a shared counter so items of ``uniqueItems`` arrays are
    distinct, and every value differs from the model defaults, so a field that
    is dropped or renamed cannot round-trip by accident.
    """
    if "oneOf" in schema:
        return _sample(next(s for s in schema["oneOf"] if s.get("type") != "null"), counter)
    schema = _resolve(schema)
    if "enum" in schema:
        return schema["enum"][-1]
    kind = schema["type"]
    if kind == "integer":
        return int(schema.get("minimum", 0)) + next(counter)
    if kind == "boolean":
        return True
    if kind == "string":
        if schema.get("format") == "date-time":
            return f"2024-05-01T12:{next(counter) % 60:02d}:56Z"
        return f"s{next(counter)}"
    if kind == "array":
        return [_sample(schema["items"], counter) for _ in range(2)]
    if "properties" in schema:
        return {name: _sample(prop, counter) for name, prop in schema["properties"].items()}
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        return {f"k{next(counter)}": _sample(extra, counter) for _ in range(2)}
    return {}


@pytest.mark.parametrize("schema_name", OBJECT_SCHEMAS)
def test_round_trip_through_json(schema_name: str) -> None:
    model = _model_for(schema_name)
    doc = _sample(_schemas()[schema_name], itertools.count(1))
    raw = json.dumps(doc)

    from_json = model.from_wire(raw)
    from_python = model.model_validate(doc)

    assert from_json == from_python
    assert from_json.to_wire() == doc
    assert json.loads(json.dumps(from_json.to_wire())) == doc
    assert model.from_wire(from_json.model_dump_json(by_alias=True)) == from_json


@pytest.mark.parametrize("operation_id", sorted(_INLINE_WRAPPERS))
def test_inline_wrappers_round_trip(operation_id: str) -> None:
    schema = _operation(operation_id)["responses"]["200"]["content"]["application/json"]["schema"]
    doc = _sample(schema, itertools.count(1))
    model = _INLINE_WRAPPERS[operation_id]
    assert model.from_wire(json.dumps(doc)).to_wire() == doc


# --------------------------------------------------------------------------
# Hand-written wire examples
# --------------------------------------------------------------------------


def _heartbeat_doc() -> dict[str, Any]:
    return {
        "protocolVersion": 1,
        "requestId": "req-1",
        "memberId": "10.0.0.7-m0",
        "memberName": "orders-worker",
        "memberEpoch": 3,
        "metadataVersion": 12,
        "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 4, "availableConcurrency": 2},
        "ownedShards": [{"shardIndex": 0}, {"shardIndex": 5}],
        "revokingShards": [
            {
                "shard": {"shardIndex": 7},
                "state": "REVOKED",
                "inFlight": 0,
                "ackedAt": "2024-05-01T12:00:00Z",
            }
        ],
        "shardProgress": [
            {
                "shard": {"shardIndex": 0},
                "streamKey": "create-order:0",
                "lastDeliveredId": "1714564800000-0",
                "lastAckedId": None,
                "pendingCount": 3,
                "updatedAt": "2024-05-01T12:00:01.500000+09:00",
            }
        ],
    }


def test_heartbeat_request_parses_camel_case() -> None:
    request = HeartbeatRequest.from_wire(json.dumps(_heartbeat_doc()))
    assert request.member_epoch == 3
    assert request.runtime_consumer_capacity.available_concurrency == 2
    assert shard_indexes(request.owned_shards) == [0, 5]
    assert request.revoking_shards[0].state is RevokingShardState.REVOKED
    assert request.revoking_shards[0].acked_at == datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert request.to_wire() == _heartbeat_doc()


def test_models_accept_python_names_and_dump_camel_case() -> None:
    response = HeartbeatResponse(
        response_to="req-1",
        status=HeartbeatStatus.REVOKE_PENDING,
        member_id="m0",
        member_epoch=4,
        heartbeat_interval_ms=3000,
        rebalance_timeout_ms=60000,
        group_epoch=9,
        assignment_epoch=8,
        metadata_version=12,
        assignment=AssignmentView(
            assigned_shards=shard_ids([2, 1]), pending_shards=shard_ids([3]), metadata_version=12
        ),
    )
    assert response.to_wire() == {
        "responseTo": "req-1",
        "status": "REVOKE_PENDING",
        "memberId": "m0",
        "memberEpoch": 4,
        "heartbeatIntervalMs": 3000,
        "rebalanceTimeoutMs": 60000,
        "groupEpoch": 9,
        "assignmentEpoch": 8,
        "metadataVersion": 12,
        "assignment": {
            "assignedShards": [{"shardIndex": 1}, {"shardIndex": 2}],
            "pendingShards": [{"shardIndex": 3}],
            "metadataVersion": 12,
        },
    }


def test_nullable_fields_are_sent_as_null_unless_excluded() -> None:
    offset = StreamShardOffset(shard=ShardId(shard_index=0), lag=None)
    assert offset.to_wire()["lag"] is None
    assert "lag" not in offset.to_wire(exclude_none=True)


def test_grafana_option_row_uses_double_underscore_keys() -> None:
    row = GrafanaOptionRow.from_wire({"__text": "create-order", "__value": "create-order"})
    assert (row.text, row.value) == ("create-order", "create-order")
    assert GrafanaOptionRow(text="a", value="b").to_wire() == {"__text": "a", "__value": "b"}


def test_member_view_passes_additional_properties_through() -> None:
    doc = {"memberId": "m0", "state": "ACTIVE", "leaseExpiresAt": "2024-05-01T12:00:00Z"}
    view = MemberView.from_wire(doc)
    assert view.to_wire()["leaseExpiresAt"] == "2024-05-01T12:00:00Z"


def test_unknown_fields_are_ignored() -> None:
    doc = _heartbeat_doc() | {"clientModuleVersion": "9.9.9", "futureThing": {"a": 1}}
    request = HeartbeatRequest.from_wire(doc)
    assert "clientModuleVersion" not in request.to_wire()
    assert HeartbeatResponse.from_wire({"status": "OK", "newField": 1}).status is HeartbeatStatus.OK


def test_datetimes_serialise_iso_8601_with_offset() -> None:
    utc = HeartbeatRequest.from_wire(_heartbeat_doc()).revoking_shards[0]
    assert utc.to_wire()["ackedAt"] == "2024-05-01T12:00:00Z"
    seoul = timezone(timedelta(hours=9))
    report = utc.model_copy(update={"acked_at": datetime(2024, 5, 1, 21, tzinfo=seoul)})
    assert report.to_wire()["ackedAt"] == "2024-05-01T21:00:00+09:00"


def test_json_schema_carries_contract_details() -> None:
    schema = HeartbeatRequest.model_json_schema(by_alias=True)
    props = schema["properties"]
    assert props["ownedShards"]["uniqueItems"] is True
    assert (props["memberEpoch"]["type"], props["memberEpoch"]["format"]) == ("integer", "int64")
    # The int64 range check is implied by the format, not spelled out.
    assert "minimum" not in props["memberEpoch"]
    assert props["memberId"]["maxLength"] == 256


def test_constants() -> None:
    assert PROTOCOL_VERSION == 1
    assert PROTOCOL_VERSION in SUPPORTED_PROTOCOL_VERSIONS
    assert list(SUPPORTED_PROTOCOL_VERSIONS) == [1]
    assert API_PREFIX == "/coord/v1"


# --------------------------------------------------------------------------
# ShardId helpers
# --------------------------------------------------------------------------


def test_shard_id_is_frozen_and_hashable() -> None:
    shard = ShardId(shard_index=3)
    assert {shard, ShardId(shard_index=3), ShardId.from_wire({"shardIndex": 3})} == {shard}
    with pytest.raises(ValidationError):
        shard.shard_index = 4  # type: ignore[misc]


def test_shard_helpers_sort_and_deduplicate() -> None:
    assert shard_ids([5, 1, 5, 0]) == [ShardId(shard_index=i) for i in (0, 1, 5)]
    assert shard_indexes([ShardId(shard_index=9), ShardId(shard_index=2)]) == [2, 9]
    assert shard_indexes({ShardId(shard_index=1)}) == [1]
    assert shard_ids([]) == []


@given(st.sets(st.integers(min_value=0, max_value=2**31 - 1), max_size=50))
def test_shard_helpers_are_inverse(indexes: set[int]) -> None:
    assert shard_indexes(shard_ids(indexes)) == sorted(indexes)


@given(st.lists(st.integers(min_value=0, max_value=10_000), unique=True, max_size=30))
def test_heartbeat_round_trip_for_any_ownership(owned: list[int]) -> None:
    doc = _heartbeat_doc() | {"ownedShards": [{"shardIndex": i} for i in owned]}
    request = HeartbeatRequest.from_wire(json.dumps(doc))
    assert [s.shard_index for s in request.owned_shards] == owned
    assert request.to_wire() == doc


# --------------------------------------------------------------------------
# Validation failures
# --------------------------------------------------------------------------


def _with(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(doc))
    target: Any = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copy


_BAD_HEARTBEATS: list[tuple[str, tuple[str | int, ...], Any]] = [
    ("epoch-not-a-number", ("memberEpoch",), "abc"),
    ("epoch-numeric-string", ("memberEpoch",), "5"),
    ("epoch-bool", ("memberEpoch",), True),
    ("epoch-fraction", ("memberEpoch",), 1.5),
    ("epoch-float", ("memberEpoch",), 1.0),
    ("epoch-int64-overflow", ("memberEpoch",), 2**63),
    ("epoch-null", ("memberEpoch",), None),
    ("metadata-version-bool", ("metadataVersion",), False),
    ("protocol-version-zero", ("protocolVersion",), 0),
    ("protocol-version-bool", ("protocolVersion",), True),
    ("capacity-list", ("runtimeConsumerCapacity",), [4, 2]),
    ("capacity-string", ("runtimeConsumerCapacity",), "4"),
    ("max-concurrency-zero", ("runtimeConsumerCapacity", "runtimeMaxConcurrency"), 0),
    ("available-negative", ("runtimeConsumerCapacity", "availableConcurrency"), -1),
    ("available-bool", ("runtimeConsumerCapacity", "availableConcurrency"), True),
    ("owned-not-a-list", ("ownedShards",), {"shardIndex": 1}),
    ("owned-duplicates", ("ownedShards",), [{"shardIndex": 2}, {"shardIndex": 2}]),
    ("owned-negative-index", ("ownedShards", 0, "shardIndex"), -1),
    ("owned-index-missing", ("ownedShards", 0), {}),
    ("owned-index-bool", ("ownedShards", 0, "shardIndex"), True),
    ("revoking-in-flight-negative", ("revokingShards", 0, "inFlight"), -1),
    ("revoking-unknown-state", ("revokingShards", 0, "state"), "GONE"),
    ("revoking-naive-datetime", ("revokingShards", 0, "ackedAt"), "2024-05-01T12:00:00"),
    ("progress-pending-string", ("shardProgress", 0, "pendingCount"), "3"),
    ("member-id-oversize", ("memberId",), "m" * 257),
    ("member-id-number", ("memberId",), 7),
    ("request-id-oversize", ("requestId",), "r" * 257),
    ("member-name-oversize", ("memberName",), "n" * 257),
]


@pytest.mark.parametrize("mode", ["json", "python"])
@pytest.mark.parametrize(
    ("path", "value"),
    [pytest.param(path, value, id=case) for case, path, value in _BAD_HEARTBEATS],
)
def test_invalid_heartbeat_is_rejected(mode: str, path: tuple[str | int, ...], value: Any) -> None:
    doc = _with(_heartbeat_doc(), path, value)
    with pytest.raises(ValidationError) as excinfo:
        if mode == "json":
            HeartbeatRequest.model_validate_json(json.dumps(doc))
        else:
            HeartbeatRequest.model_validate(doc)
    # The error points at the offending camelCase field.
    assert any(err["loc"][: len(path)] == path for err in excinfo.value.errors()), (
        excinfo.value.errors()
    )


def test_boundary_values_are_accepted() -> None:
    doc = _with(_heartbeat_doc(), ("memberId",), "m" * 256)
    doc = _with(doc, ("memberEpoch",), -1)
    doc = _with(doc, ("ownedShards",), [{"shardIndex": 0}])
    doc = _with(doc, ("runtimeConsumerCapacity", "availableConcurrency"), 0)
    doc = _with(doc, ("metadataVersion",), 2**63 - 1)
    assert HeartbeatRequest.from_wire(doc).to_wire() == doc


def test_duplicate_owned_shards_error_is_clear() -> None:
    doc = _with(_heartbeat_doc(), ("ownedShards",), [{"shardIndex": i} for i in (4, 1, 4, 1, 2)])
    with pytest.raises(ValidationError) as excinfo:
        HeartbeatRequest.from_wire(doc)
    message = str(excinfo.value)
    assert "ownedShards must not contain duplicate shards" in message
    assert "[1, 4]" in message


def test_duplicate_assignment_shards_are_rejected() -> None:
    with pytest.raises(ValidationError, match="duplicate"):
        AssignmentView.from_wire({"assignedShards": [{"shardIndex": 1}, {"shardIndex": 1}]})


def test_missing_required_heartbeat_fields_are_rejected() -> None:
    with pytest.raises(ValidationError) as excinfo:
        HeartbeatRequest.from_wire({"memberId": "m0"})
    missing = {err["loc"][0] for err in excinfo.value.errors() if err["type"] == "missing"}
    assert missing == {
        "protocolVersion",
        "requestId",
        "memberEpoch",
        "metadataVersion",
        "runtimeConsumerCapacity",
    }


_BAD_ADMIN: list[tuple[str, str, dict[str, Any]]] = [
    ("scale-negative", "ScaleStreamRequest", {"targetShardCount": -1}),
    ("scale-bool", "ScaleStreamRequest", {"targetShardCount": True}),
    ("scale-string", "ScaleGroupRequest", {"targetShardCount": "20"}),
    ("scale-missing-reason", "ScaleGroupRequest", {"reason": None}),
    ("requested-by-oversize", "ScaleStreamRequest", {"requestedBy": "x" * 1025}),
    ("reason-oversize", "RollbackMigrationRequest", {"reason": "x" * 1025}),
    ("create-zero-shards", "CreateStreamRequest", {"initialShardCount": 0}),
    ("create-group-zero-shards", "CreateGroupRequest", {"initialShardCount": 0}),
    ("create-missing-requested-by", "CreateStreamRequest", {"requestedBy": None}),
    ("delete-force-string", "DeleteGroupRequest", {"force": "yes"}),
    ("delete-force-int", "DeleteGroupRequest", {"force": 1}),
    ("body-is-a-list", "RollbackMigrationRequest", {"__root__": [1, 2]}),
]


def _admin_doc(model_name: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"requestedBy": "operator@example.com", "reason": "load"}
    if "Scale" in model_name:
        doc["targetShardCount"] = 20
    if "Create" in model_name:
        doc["initialShardCount"] = 4
    return doc


@pytest.mark.parametrize(
    ("model_name", "change"),
    [pytest.param(model, change, id=case) for case, model, change in _BAD_ADMIN],
)
def test_invalid_admin_request_is_rejected(model_name: str, change: dict[str, Any]) -> None:
    model = _model_for(model_name)
    assert model.from_wire(_admin_doc(model_name)).to_wire()  # the base document is valid
    doc: Any = change["__root__"] if "__root__" in change else _admin_doc(model_name) | change
    with pytest.raises(ValidationError):
        model.from_wire(json.dumps(doc))
    with pytest.raises(ValidationError):
        model.model_validate(doc)


def test_delete_group_force_defaults_to_false() -> None:
    request = DeleteGroupRequest.from_wire({"requestedBy": "op", "reason": "cleanup"})
    assert request.force is False
