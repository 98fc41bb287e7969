"""The one heartbeat path (api/members.py): every credential gets the same answers.

Bearer and Basic heartbeats take the same route but authenticate differently
(a cached token check against a password check with its login limiter).  The
same sequence of requests, sent to two identical groups, one with each, must
get the same answers: statuses, bodies, retry and challenge headers, rate
limits included (the coordinator here allows 12 heartbeats per group per
window, so longer sequences reach it).  Refusals are audited and every
heartbeat is timed under its operationId, as any other route's requests.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamkit.protocol import (
    API_PREFIX,
    AssignmentView,
    HeartbeatAnswer,
    HeartbeatResponse,
    HeartbeatStatus,
    shard_ids,
)
from streamkit.testing import RedisServer, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.api import create_app
from streamkit_server.api.entry import CoordinatorApp
from streamkit_server.api.guards import RequestIdMiddleware
from streamkit_server.api.members import OPERATION_ID, heartbeat_route
from streamkit_server.settings import ServerSettings
from tests.coordinator_fixtures import CoordinatorPool

pytestmark = pytest.mark.redis

PREFIX = "hbpath"
LIMIT = 12  # heartbeats per group per window (rate multiple 1 x 12 members)


@dataclass
class Served:
    coordinator: CoordinatorProcess
    http: httpx.Client
    bearer: dict[str, str]

    def create_group(self, group: str) -> None:
        body = {"requestedBy": "tests", "reason": "tests", "initialShardCount": 4}
        r = self.http.post(
            f"{API_PREFIX}/streams/{PREFIX}/groups/{group}",
            json=body,
            auth=self.coordinator.admin_auth,
        )
        assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def served(redis_server: RedisServer, coordinator_pool: CoordinatorPool) -> Iterator[Served]:
    # Intervals long enough that no lease or rebalance timer runs out between
    # the two copies of a step: only the requests decide the answers.
    coordinator = coordinator_pool.get(
        RedisTarget(url=redis_server.url, cluster=False),
        heartbeat_interval_ms=10_000,
        member_lease_ttl_ms=60_000,
        rebalance_timeout_ms=60_000,
        env={
            "STREAMKIT_SERVER_HEARTBEAT_RATE_MULTIPLE": "1",
            "STREAMKIT_SERVER_MAX_MEMBERS_PER_GROUP": str(LIMIT),
        },
    )
    with httpx.Client(base_url=coordinator.url, timeout=15) as http:
        login = http.post(f"{API_PREFIX}/auth/login", auth=coordinator.admin_auth)
        assert login.status_code == 200, login.text
        bearer = {"authorization": f"Bearer {login.json()['accessToken']}"}
        yield Served(coordinator, http, bearer)


@dataclass
class Member:
    epoch: int = 0
    version: int = 0
    owned: list[Any] = field(default_factory=list)


def _body(member_id: str, epoch: int, owned: list[Any], version: int = 0) -> dict[str, Any]:
    return {
        "protocolVersion": 1,
        "requestId": f"r-{uuid.uuid4().hex[:8]}",
        "memberId": member_id,
        "memberEpoch": epoch,
        "metadataVersion": version,
        "runtimeConsumerCapacity": {"maxConcurrentShards": 4},
        "ownedShards": owned,
        "revokingShards": [],
        "shardProgress": [],
        "incarnation": f"inc-{member_id}",
    }


# One step: which member, and what it sends.
_KINDS = [
    "heartbeat",  # its current epoch, reporting what it was assigned
    "join",
    "leave",
    "stale_epoch",
    "future_epoch",
    "other_incarnation",
    "malformed_json",
    "missing_field",
    "wrong_type",
    "text_plain",
    "unknown_group",
    "bad_member_id",
    "bad_group_name",
]
# Weighted towards a group at work: members join, then heartbeat steadily.
_WEIGHTED = ["heartbeat"] * 6 + ["join"] * 3 + _KINDS
steps = st.lists(st.tuples(st.integers(0, 2), st.sampled_from(_WEIGHTED)), min_size=1, max_size=18)


def _request(kind: str, group: str, member_id: str, member: Member) -> tuple[str, bytes, str]:
    """(path, body, content type) of one step against ``group``."""
    path_group, path_member = group, member_id
    body: dict[str, Any] | None = _body(member_id, member.epoch, member.owned, member.version)
    raw: bytes | None = None
    content_type = "application/json"
    if kind == "join":
        body = _body(member_id, 0, [])
    elif kind == "leave":
        body = _body(member_id, -1, [])
    elif kind == "stale_epoch":
        body = _body(member_id, max(1, member.epoch - 1), member.owned, member.version)
    elif kind == "future_epoch":
        body = _body(member_id, member.epoch + 5, member.owned, member.version)
    elif kind == "other_incarnation":
        body = {**_body(member_id, 0, []), "incarnation": "inc-intruder"}
    elif kind == "malformed_json":
        raw = b'{"protocolVersion": 1,'
    elif kind == "missing_field":
        body = {k: v for k, v in _body(member_id, 0, []).items() if k != "memberEpoch"}
    elif kind == "wrong_type":
        body = {**_body(member_id, 0, []), "memberEpoch": "one"}
    elif kind == "text_plain":
        content_type = "text/plain"
    elif kind == "unknown_group":
        path_group = f"{group}-missing"
    elif kind == "bad_member_id":
        path_member = "x" * 300
    elif kind == "bad_group_name":
        path_group = "bad name!"
    if raw is None:
        raw = json.dumps(body).encode()
    path = f"{API_PREFIX}/streams/{PREFIX}/groups/{path_group}/members/{path_member}/heartbeat"
    return path, raw, content_type


def _answer(response: httpx.Response, group: str, epochs: dict[int, int]) -> tuple[Any, ...]:
    text = response.text.replace(group, "GROUP")
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = text
    if isinstance(body, dict):
        body.pop("responseTo", None)  # echoes the request id, drawn per request
        epoch = body.get("memberEpoch")
        if isinstance(epoch, int) and epoch > 0:
            # Epochs are drawn from the clock: two groups issue different
            # numbers for the same history, so compare the order of issue.
            body["memberEpoch"] = epochs.setdefault(epoch, len(epochs) + 1)
    headers = {h: response.headers.get(h) for h in ("content-type", "retry-after")}
    if response.status_code == 429:
        # The seconds left in the window: the two requests of a step are sent
        # one after the other, and may straddle a second.
        assert 1 <= int(headers["retry-after"] or "0") <= 10, headers
        headers["retry-after"] = "N"
        body["message"] = re.sub(r"retry in \d+ s", "retry in N s", body["message"])
    return response.status_code, body, headers


def _learn(member: Member, response: httpx.Response) -> None:
    if response.status_code != 200:
        return
    answer = response.json()
    if answer.get("memberEpoch", 0) > 0:
        member.epoch = answer["memberEpoch"]
    if answer.get("metadataVersion") is not None:
        member.version = answer["metadataVersion"]
    assignment = answer.get("assignment")
    if assignment is not None:  # it reads what it is assigned, and reports it
        member.owned = list(assignment["assignedShards"])


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps)
def test_bearer_and_basic_heartbeats_get_the_same_answers(
    served: Served, sequence: list[Any]
) -> None:
    run = uuid.uuid4().hex[:8]
    groups = {"bearer": f"bearer-{run}", "basic": f"basic-{run}"}
    for group in groups.values():
        served.create_group(group)
    members = {side: [Member() for _ in range(3)] for side in groups}
    epochs: dict[str, dict[int, int]] = {side: {} for side in groups}
    for index, kind in sequence:
        answers = {}
        for side, group in groups.items():
            member = members[side][index]
            path, raw, content_type = _request(kind, group, f"m{index}", member)
            headers = {"content-type": content_type}
            if side == "bearer":
                headers.update(served.bearer)
                auth = None
            else:
                auth = served.coordinator.member_auth
            response = served.http.post(path, content=raw, headers=headers, auth=auth)
            assert response.status_code != 500, response.text
            answers[side] = _answer(response, group, epochs[side])
            _learn(member, response)
        assert answers["bearer"] == answers["basic"], (kind, answers)


def test_invalid_bearer_heartbeats_are_refused(served: Served) -> None:
    group = f"auth-{uuid.uuid4().hex[:8]}"
    served.create_group(group)
    path = f"{API_PREFIX}/streams/{PREFIX}/groups/{group}/members/m0/heartbeat"
    body = _body("m0", 0, [])
    bad = served.http.post(path, json=body, headers={"authorization": "Bearer not-a-token"})
    assert bad.status_code == 401
    assert bad.json()["errorCode"] == "UNAUTHORIZED"
    assert "Bearer" in bad.headers["www-authenticate"]
    ok = served.http.post(path, json=body, headers=served.bearer)
    assert ok.status_code == 200, ok.text


async def test_heartbeats_are_timed_audited_and_tried_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """In process: the app's entry tries the heartbeat route first, under the
    coordinator's middlewares (the request-id guard outermost), so heartbeats
    are timed under the operationId, a refused one is audited with a safe
    request id, and another method gets the ErrorResponse 405."""
    # A Redis of its own: the session's runs coordinators with other timings.
    with RedisServer() as redis:
        await _through_the_app(redis.url, caplog)


async def _through_the_app(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(ServerSettings(redis_url=redis_url), admin_password="pw", token_secret=b"s")
    assert isinstance(app, CoordinatorApp)
    assert app.first is heartbeat_route()
    assert app.outer[0].cls is RequestIdMiddleware
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://coord") as http:
            created = await http.post(
                f"{API_PREFIX}/streams/{PREFIX}/groups/entry",
                json={"requestedBy": "tests", "initialShardCount": 2},
                auth=("admin", "pw"),
            )
            assert created.status_code == 201, created.text
            login = await http.post(f"{API_PREFIX}/auth/login", auth=("admin", "pw"))
            bearer = {"authorization": f"Bearer {login.json()['accessToken']}"}
            path = f"{API_PREFIX}/streams/{PREFIX}/groups/entry/members/m0/heartbeat"
            ok = await http.post(path, json=_body("m0", 0, []), headers=bearer)
            assert ok.status_code == 200, ok.text
            # The lease TTL reported is the service's, the one its leases use.
            ttl = app.state.runtime.service.config.member_lease_ttl_ms
            assert ok.json()["memberLeaseTtlMs"] == ttl
            with caplog.at_level(logging.INFO, logger="streamkit_server.audit"):
                refused = await http.post(
                    path,
                    json=_body("m0", 0, []),
                    headers={"authorization": "Bearer nope", "x-request-id": "a\tb"},
                )
            assert refused.status_code == 401
            audited = [json.loads(r.getMessage()) for r in caplog.records]
            assert [(a["action"], a["kind"], a["status"]) for a in audited] == [
                ("sendConsumerHeartbeat", "refusal", 401)
            ]
            assert audited[0]["requestId"].startswith("gen-")
            other = await http.put(path, json=_body("m0", 0, []), headers=bearer)
            assert other.status_code == 405, other.text
            assert other.json()["errorCode"] == "METHOD_NOT_ALLOWED"
            assert other.headers["allow"] == "POST"
            metrics = (await http.get("/metrics", auth=("admin", "pw"))).text
    counted = {
        status: float(m.group(1))
        for status in ("2xx", "4xx")
        if (
            m := re.search(
                rf'^redis_stream_coord_http_requests_total{{method="POST",'
                rf'route="{OPERATION_ID}",status="{status}"}} (\S+)$',
                metrics,
                re.M,
            )
        )
    }
    assert counted == {"2xx": 1.0, "4xx": 1.0}, metrics


@pytest.mark.parametrize("assigned", [None, [0, 3]])
def test_the_answer_is_the_answer_models_json(assigned: list[int] | None) -> None:
    assignment = None
    if assigned is not None:
        assignment = AssignmentView(
            assigned_shards=shard_ids(assigned), pending_shards=shard_ids([1]), metadata_version=7
        )
    decided = HeartbeatResponse(
        response_to="r-1", status=HeartbeatStatus.OK, member_id="m-\u00e9", member_epoch=4,
        heartbeat_interval_ms=3000, rebalance_timeout_ms=60_000, assignment=assignment,
    )  # fmt: skip
    route = heartbeat_route()
    expected = HeartbeatAnswer(**dict(decided), member_lease_ttl_ms=15_000)
    for ttl in (15_000, 15_000):  # computed once, then reused
        assert route._answer_json(decided, ttl) == expected.model_dump_json(by_alias=True).encode()
    other = HeartbeatAnswer(**dict(decided), member_lease_ttl_ms=9)
    assert route._answer_json(decided, 9) == other.model_dump_json(by_alias=True).encode()
