"""A bad-input corpus over every endpoint the coordinator serves.

The endpoints come from the served ``/openapi.json``, so a new route is
covered without touching this file (a new request body needs a sample in
``SAMPLES``, and the test says so).  Every request carries valid credentials
and exactly one bad part; each must be answered with a 4xx ``ErrorResponse``
within a second, and Redis must be byte for byte what it was before.
(Well-formed heartbeats the protocol refuses, such as an unknown protocol
version or epoch, are answered 200 with a status by contract: see
``test_input.py``.)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from streamkit import protocol
from streamkit.testing import AsyncRedisClient, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.api import bodies

from ..sim import SimMember, create_group, redis_of

PREFIX, GROUP, MEMBER = "corpus", "g", "m1"
MAX_MEMBERS = 2
# The bound; a slow answer is sent once more before it counts, so a
# load spike on a shared CI machine is not mistaken for unbounded work.
ANSWER_WITHIN_S = 1.0

# A valid body per request schema; the corpus breaks one field at a time.
SAMPLES: dict[str, dict[str, Any]] = {
    "LoginRequest": {"username": "admin", "password": "nope"},
    "CreateStreamRequest": {"initialShardCount": 2, "requestedBy": "t", "reason": "r"},
    "CreateGroupRequest": {"initialShardCount": 2, "requestedBy": "t", "reason": "r"},
    "DeleteGroupRequest": {"requestedBy": "t", "reason": "r", "force": False},
    "ScaleStreamRequest": {"targetShardCount": 3, "requestedBy": "t", "reason": "r"},
    "ScaleGroupRequest": {"targetShardCount": 3, "requestedBy": "t", "reason": "r"},
    "RollbackMigrationRequest": {"requestedBy": "t", "reason": "r"},
    "ReplayDeadLetterRequest": {"requestedBy": "t", "reason": "r", "keyField": "k"},
    "SetRetentionRequest": {"requestedBy": "t", "maxAgeMs": 60000, "maxLength": 10},
    "HeartbeatRequest": {
        "protocolVersion": 1,
        "requestId": "r",
        "memberId": MEMBER,
        "memberEpoch": 0,
        "metadataVersion": 0,
        "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
        "ownedShards": [],
    },
}
# Valid path parameters (an existing group and member).
PATH_VALUES = {"streamPrefix": PREFIX, "consumerGroup": GROUP, "memberId": MEMBER,
               "shardIndex": "0", "reshardingId": "rs-unknown", "username": "nobody",
               "deadLetterId": "1-0"}  # fmt: skip

# Values that are wrong for any field of the kind, never merely "different".
BAD_INTS: list[Any] = [2**63, -(2**63) - 1, 10**30, "1", 1.5, True, [1], {"a": 1}]
BAD_STRINGS: list[Any] = ["x" * 5000, 5, ["a"], {"a": "b"}]
BAD_NAMES = ["", "a{b}", "x" * 201, "a%20b", "a%00b", "a%2Fb", "%7B%7D"]
BAD_INDEXES = ["-1", "2147483648", "99999999999999999999999", "abc", "1e3", "0x1"]
BAD_QUERY_INTS = ["0", "-1", "1001", "99999999999999999999999", "abc", ""]
BAD_BODIES: list[dict[str, Any]] = [
    {"content": b"{not json"},
    {"content": b"[" * 5000 + b"]" * 5000},
    {"content": b'{"a": 1e999999}'},
    {"content": b"\xff\xfe garbage"},
    {"content": b"null"},
    {"content": b"[]"},
    {"content": b'"text"'},
]
# The counts of issue 10, each just above its bound and far above it.
COUNT_BODIES: dict[str, list[dict[str, Any]]] = {
    "CreateStreamRequest": [{"initialShardCount": n} for n in (0, 65_537, 100_000, 10**9)],
    "CreateGroupRequest": [{"initialShardCount": n} for n in (0, 65_537, 100_000, 10**9)],
    "ScaleStreamRequest": [{"targetShardCount": n} for n in (-1, 65_537, 10**9)],
    "ScaleGroupRequest": [{"targetShardCount": n} for n in (-1, 65_537, 10**9)],
    "HeartbeatRequest": [
        {"ownedShards": [{"shardIndex": 2**31}]},
        {"ownedShards": [{"shardIndex": 0}, {"shardIndex": 0}]},
        {"ownedShards": [{"shardIndex": i} for i in range(4097)]},
        {"shardProgress": [{"shard": {"shardIndex": 0}}] * 4097},
    ],
}
BLANK_TEXT = {"requestedBy": ["", " ", "\t\n"], "reason": ["", "  "]}
CURSORS = ["18446744073709551616-0", "0-18446744073709551616", "99999999999999999999-0",
           "1-1-1", "-1-0", "x", "1" * 65]  # fmt: skip


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_samples_are_valid_so_each_case_has_exactly_one_fault(name: str) -> None:
    model = getattr(bodies, name, None) or getattr(protocol, name)
    model.model_validate(SAMPLES[name])


def _schema_of(spec: dict[str, Any], ref_or_schema: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in ref_or_schema:
        name = ref_or_schema["$ref"].rsplit("/", 1)[-1]
        schema: dict[str, Any] = spec["components"]["schemas"][name]
        return schema
    return ref_or_schema


def _body_model(spec: dict[str, Any], operation: dict[str, Any]) -> str | None:
    content = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if not content:
        return None
    schema = content["schema"]
    for option in schema.get("anyOf", [schema]):
        if "$ref" in option:
            name: str = option["$ref"].rsplit("/", 1)[-1]
            return name
    raise AssertionError(f"request body without a named schema: {schema}")


def _field_kind(spec: dict[str, Any], prop: dict[str, Any]) -> str:
    for option in prop.get("anyOf", [prop]):
        option = _schema_of(spec, option)
        if option.get("type") in ("integer", "string", "array", "boolean", "object"):
            return "enum" if "enum" in option else str(option["type"])
    return "other"


def _bad_values(kind: str) -> list[Any]:
    return {
        "integer": BAD_INTS,
        "string": BAD_STRINGS,
        "enum": ["BOGUS", 1],
        "array": ["not a list", [1, 2], {"a": 1}],
        "boolean": ["yes", 2, [True]],
        "object": ["x", [1], 5],
    }.get(kind, [])


Case = tuple[str, str, dict[str, Any], str]


def _corpus(spec: dict[str, Any]) -> Iterator[Case]:
    """(method, path, httpx kwargs, what is bad) for every operation."""
    for template, item in spec["paths"].items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "delete", "patch"):
                continue
            yield from _operation_cases(spec, template, method.upper(), operation)


def _operation_cases(
    spec: dict[str, Any], template: str, method: str, operation: dict[str, Any]
) -> Iterator[Case]:
    params = operation.get("parameters", [])
    path_names = [p["name"] for p in params if p["in"] == "path"]
    missing = [n for n in path_names if n not in PATH_VALUES]
    assert not missing, f"add a valid value for path parameters {missing} to PATH_VALUES"
    model = _body_model(spec, operation)
    sample: dict[str, Any] | None = None
    if model is not None:
        assert model in SAMPLES, f"add a valid sample body for {model} to SAMPLES"
        sample = SAMPLES[model]

    def path(**override: str) -> str:
        values = {**PATH_VALUES, **override}
        return template.format(**{n: values[n] for n in path_names})

    def body(value: Any) -> dict[str, Any]:
        return {"json": value} if value is not None else {}

    base_body = body(sample) if sample is not None else {}
    yield "PATCH", path(), {}, "wrong method"
    for name in path_names:
        bad = BAD_INDEXES if name == "shardIndex" else BAD_NAMES
        if name == "memberId":
            bad = ["x" * 300, "a%01b"]
        for value in bad:
            yield method, path(**{name: value}), base_body, f"path {name}={value[:20]!r}"
    for param in (p for p in params if p["in"] == "query"):
        name = param["name"]
        kind = _field_kind(spec, param["schema"])
        values = CURSORS if name == "cursor" else BAD_QUERY_INTS if kind == "integer" else []
        if kind == "enum":
            values = ["BOGUS", ""]
        for value in values:
            yield method, path(), {"params": {name: value}}, f"query {name}={value[:20]!r}"
    if sample is None or model is None:
        return
    for bad_body in BAD_BODIES:
        kwargs = {**bad_body, "headers": {"content-type": "application/json"}}
        yield method, path(), kwargs, f"body {bad_body['content'][:20]!r}"
    schema = spec["components"]["schemas"][model]
    for field, prop in schema.get("properties", {}).items():
        for value in _bad_values(_field_kind(spec, prop)):
            broken = copy.deepcopy(sample)
            broken[field] = value
            yield method, path(), body(broken), f"{model}.{field}={str(value)[:20]}"
        if field in schema.get("required", []):
            broken = {k: v for k, v in sample.items() if k != field}
            yield method, path(), body(broken), f"{model} without {field}"
    for change in COUNT_BODIES.get(model, []):
        yield method, path(), body({**sample, **change}), f"{model} {change}"
    for field, blanks in BLANK_TEXT.items():
        if field in schema.get("required", []):
            for blank in blanks:
                yield method, path(), body({**sample, field: blank}), f"{model}.{field} blank"


async def _snapshot(r: AsyncRedisClient) -> dict[str, Any]:
    """Every key with its type and full value (streams: entries and groups)."""
    state: dict[str, Any] = {}
    for key in sorted(await r.keys("*")):
        if ":ratelimit:" in key:
            continue  # the rate limiter's expiring counters count bad requests too
        if key.endswith(":coordinators"):
            continue  # each process refreshes its entry from the tick loop
        kind = await r.type(key)
        value: Any
        if kind == "string":
            value = await r.get(key)
        elif kind == "hash":
            value = await r.hgetall(key)
        elif kind == "set":
            value = sorted(await r.smembers(key))
        elif kind == "zset":
            value = await r.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            value = await r.lrange(key, 0, -1)
        elif kind == "stream":
            value = (await r.xrange(key), await r.xinfo_groups(key))
        else:
            value = None
        state[key] = (kind, value, await r.ttl(key) > 0)
    return state


@pytest.fixture
async def corpus_coordinator(redis_url: str, coordinator_factory: Any) -> CoordinatorProcess:
    target = RedisTarget(url=redis_url, cluster=False)
    coord: CoordinatorProcess = coordinator_factory(
        target,
        # Long timings: no member expires and no tick changes Redis while the
        # corpus runs, so any difference afterwards is a request's doing.
        heartbeat_interval_ms=10_000,
        member_lease_ttl_ms=120_000,
        rebalance_timeout_ms=120_000,
        # The corpus floods one tiny group with heartbeats on purpose: the
        # per-group heartbeat limit (tested in test_rate_limits.py) is off.
        env={
            "STREAMKIT_SERVER_MAX_MEMBERS_PER_GROUP": str(MAX_MEMBERS),
            "STREAMKIT_SERVER_HEARTBEAT_RATE_MULTIPLE": "0",
        },
    )
    async with httpx.AsyncClient() as http:
        await create_group(http, coord, PREFIX, GROUP, 2)
        for member in ("m1", "m2"):
            await SimMember(http, coord.url, PREFIX, GROUP, member).heartbeat()
    return coord


async def test_every_endpoint_answers_bad_input_with_a_fast_4xx_and_writes_nothing(
    corpus_coordinator: CoordinatorProcess, redis_url: str
) -> None:
    coord = corpus_coordinator
    target = RedisTarget(url=redis_url, cluster=False)
    async with (
        # A request that would never be answered fails the test after 5 s.
        httpx.AsyncClient(base_url=coord.url, auth=coord.admin_auth, timeout=5) as http,
        redis_of(target) as r,
    ):
        spec = (await http.get("/openapi.json")).json()
        cases = list(_corpus(spec))
        # Joining a full group (MAX_MEMBERS live members) is bad input too.
        join = {**SAMPLES["HeartbeatRequest"], "memberId": "m3"}
        cases.append(("POST", f"/coord/v1/streams/{PREFIX}/groups/{GROUP}/members/m3/heartbeat",
                      {"json": join}, "join beyond max members"))  # fmt: skip
        assert len({c[1].split("?")[0] for c in cases}) >= 20, "the walk found too few routes"
        before = await _snapshot(r)
        failures = []
        for method, path, kwargs, what in cases:
            if path.endswith("/auth/login"):
                # Valid Basic credentials make any body a fine login: the
                # body is optional there.
                kwargs = {**kwargs, "auth": None}
            problem: str | None = None
            for _attempt in range(2):
                started = time.perf_counter()
                try:
                    response = await http.request(method, path, **kwargs)
                except httpx.HTTPError as exc:  # no answer at all (or a dropped connection)
                    problem = f"no answer: {exc!r}"
                    break
                elapsed = time.perf_counter() - started
                problem = _problem(response, elapsed)
                if elapsed < ANSWER_WITHIN_S:
                    break
            if problem:
                failures.append(f"{method} {path[:90]} ({what}): {problem}")
        assert not failures, "\n".join(failures[:30]) + f"\n({len(failures)} of {len(cases)})"
        full = await http.request(*cases[-1][:2], **cases[-1][2])
        assert (full.status_code, full.json()["errorCode"]) == (400, "TOO_MANY_MEMBERS")
        assert await _snapshot(r) == before


def _problem(response: httpx.Response, elapsed: float) -> str | None:
    if elapsed >= ANSWER_WITHIN_S:
        return f"answered after {elapsed:.2f} s"
    if not 400 <= response.status_code < 500:
        return f"status {response.status_code}: {response.text[:200]}"
    try:
        body = response.json()
    except ValueError:
        return f"not JSON: {response.text[:200]}"
    if not isinstance(body, dict) or set(body) != {"status", "errorCode", "message"}:
        return f"not an ErrorResponse: {body}"
    if body["status"] != str(response.status_code) or not body["errorCode"] or not body["message"]:
        return f"inconsistent ErrorResponse: {body}"
    return None
