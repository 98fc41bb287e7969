"""Operations over real HTTP and real Redis: health with reasons, the loopback
metrics port, the audit stream, the compatibility-failure metric and the
heartbeat and admin-mutation rate limits.

One coordinator for the module, connected as a Redis ACL user that lacks
``XREVRANGE`` (so a Redis command refusal can be provoked on demand) and with
its limits set low enough to trip in a few requests.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio
from helpers import KEY_PREFIX, eventually, join_body, metadata_key
from pydantic import ValidationError

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit.testing.redis_server import free_port
from streamkit_server.auth.principals import hash_password
from streamkit_server.core import LAYOUT_VERSION, SCHEMA_VERSION
from streamkit_server.observability.health import HealthFacts, assess, lag_limit_s
from streamkit_server.settings import ServerSettings

from ..sim import API

PASSWORDS = {"reader": "ops-r-3b8e", "writer": "ops-w-77d1"}
PRINCIPALS = json.dumps(
    [
        {"username": "reader", "passwordHash": hash_password(PASSWORDS["reader"]),
         "roles": ["READ"]},
        {"username": "writer", "passwordHash": hash_password(PASSWORDS["writer"]),
         "roles": ["WRITE"]},
    ]
)  # fmt: skip
REDIS_USER, REDIS_PASSWORD = "ops-coordinator", "ops-redis-pw-5c2a"
AUDIT_KEY = "ops:audit"
AUDIT_MAXLEN = 50
# Heartbeats per group per interval: HEARTBEAT_RATE_MULTIPLE x MAX_MEMBERS_PER_GROUP.
HB_LIMIT = 1 * 3
ADMIN_LIMIT = 5
READER = ("reader", PASSWORDS["reader"])
WRITER = ("writer", PASSWORDS["writer"])


@pytest.fixture(scope="module")
def ops_redis() -> Iterator[RedisServer]:
    """A Redis of this module's own: the limiter windows count per principal in
    Redis, and other modules' admin mutations (same worker, same minute) on the
    shared server would be counted against this module's lowered limits."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def ops(ops_redis: RedisServer) -> Iterator[tuple[CoordinatorProcess, int]]:
    redis_server = ops_redis
    with redis_server.client() as conn:
        conn.execute_command(
            "ACL", "SETUSER", REDIS_USER, "reset", "on", f">{REDIS_PASSWORD}",
            "~*", "&*", "+@all", "-xrevrange",
        )  # fmt: skip
    url = redis_server.url.replace("redis://", f"redis://{REDIS_USER}:{REDIS_PASSWORD}@")
    metrics_port = free_port()
    with CoordinatorProcess(
        url,
        heartbeat_interval_ms=10_000,
        member_lease_ttl_ms=30_000,
        rebalance_timeout_ms=60_000,
        env={
            "STREAMKIT_SERVER_PRINCIPALS": PRINCIPALS,
            "STREAMKIT_SERVER_AUDIT_STREAM": AUDIT_KEY,
            "STREAMKIT_SERVER_AUDIT_STREAM_MAXLEN": str(AUDIT_MAXLEN),
            "STREAMKIT_SERVER_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
            "STREAMKIT_SERVER_HEARTBEAT_RATE_MULTIPLE": "1",
            "STREAMKIT_SERVER_MAX_MEMBERS_PER_GROUP": "3",
            "STREAMKIT_SERVER_ADMIN_MUTATIONS_PER_MINUTE": str(ADMIN_LIMIT),
        },
    ) as proc:
        yield proc, metrics_port
        with redis_server.client() as conn:
            conn.execute_command("ACL", "DELUSER", REDIS_USER)
        # Keys of the module (audit stream, limiter windows) must not leak into the next one.
        redis_server.flushall()


@pytest.fixture
async def r(ops_redis: RedisServer) -> AsyncIterator[Any]:
    client = redis.asyncio.Redis.from_url(ops_redis.url)
    try:
        yield client
    finally:
        await client.aclose()


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of Prometheus text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}{re.escape('{' + want + '}') if want else ''} (\S+)$"
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


async def _loopback_metrics(port: int) -> str:
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.get(f"http://127.0.0.1:{port}/metrics")
    assert answer.status_code == 200, answer.text
    return answer.text


async def _create(http: httpx.AsyncClient, prefix: str, group: str, auth: Any) -> httpx.Response:
    return await http.post(
        f"{API}/streams/{prefix}/groups/{group}",
        json={"initialShardCount": 2, "requestedBy": "ops-test", "reason": "test"},
        auth=auth,
    )


# -- health --------------------------------------------------------------------------


def test_health_rules_without_a_server() -> None:
    base = HealthFacts(0.001, None, False, True, 0.0, 1.0, None)
    assert assess(base).status == "UP" and assess(base).reasons == ()
    down = assess(HealthFacts(None, "ConnectionError: refused", False, True, 0.0, 1.0, None))
    assert down.status == "DOWN" and "Redis unreachable" in down.reasons[0]
    slow = assess(HealthFacts(0.4, None, False, True, 0.0, 1.0, None))
    assert slow.status == "DEGRADED" and slow.redis.startswith("SLOW")
    lagging = assess(HealthFacts(0.001, None, False, True, lag_limit_s(1.0) + 1, 1.0, None))
    assert lagging.status == "DEGRADED" and lagging.loop.startswith("LAGGING")
    just_in_time = assess(HealthFacts(0.001, None, False, True, lag_limit_s(1.0), 1.0, None))
    assert just_in_time.status == "UP"
    terminating = assess(HealthFacts(0.001, None, True, True, 99.0, 1.0, None))
    assert terminating.status == "DEGRADED" and terminating.loop == "TERMINATING"
    stopped = assess(HealthFacts(0.001, None, False, False, None, 1.0, None))
    assert stopped.status == "DEGRADED" and stopped.loop == "STOPPED"
    failing = assess(HealthFacts(0.001, None, False, True, 0.0, 1.0, "ConnectionError"))
    assert failing.status == "UP" and failing.loop.startswith("FAILING")
    unreadable = assess(HealthFacts(0.001, None, False, True, 0.0, 1.0, None, ("a/b",)))
    assert unreadable.status == "DEGRADED" and "a/b" in unreadable.reasons[0]
    both = assess(HealthFacts(None, "TimeoutError", True, False, None, 1.0, None, ("a/b",)))
    assert both.status == "DOWN" and len(both.reasons) == 3
    why = "coordinator coord-1 on this Redis runs with other timings"
    suspended = assess(HealthFacts(0.001, None, False, True, 0.0, 1.0, None, (), why))
    assert suspended.status == "DOWN" and suspended.loop == "SUSPENDED"
    assert suspended.reasons == (f"suspended: {why}",)


async def test_health_names_its_reasons_and_needs_read(
    ops: tuple[CoordinatorProcess, int], r: Any
) -> None:
    coord, _ = ops
    path = f"{API}/monitoring/health"
    async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
        assert (await http.get(path)).status_code == 401
        assert (await http.get(path, auth=WRITER)).status_code == 403
        answers: list[dict[str, Any]] = []

        async def up() -> bool:
            answers.append((await http.get(path, auth=READER)).json())
            return bool(answers[-1]["status"] == "UP")

        # Polled: on a loaded machine one PING may take over 250 ms (DEGRADED).
        await eventually(up, 10, "health UP", details=lambda: str(answers[-3:]))
        healthy = answers[-1]
        assert healthy["reasons"] == [], healthy
        assert healthy["redis"].startswith("UP (") and healthy["loop"] == "UP"
        assert healthy["layoutVersion"] == LAYOUT_VERSION
        assert healthy["schemaVersion"] == SCHEMA_VERSION
        assert healthy["terminating"] is False and healthy["tickLagSeconds"] >= 0
        # A group written by a newer coordinator (unknown schema): the tick
        # loop cannot use it, and health says which one.
        await r.hset(metadata_key("future", "g"), mapping={"schemaVersion": "99", "group": "{}"})
        await r.sadd(f"{KEY_PREFIX}:groups", "future\0g")

        seen: list[dict[str, Any]] = []

        async def degraded() -> bool:
            seen.append((await http.get(path, auth=READER)).json())
            return seen[-1]["status"] == "DEGRADED" and "future/g" in seen[-1]["unreadableGroups"]

        await eventually(degraded, 10, "health DEGRADED by the unreadable group")
        body = seen[-1]
        assert body["unreadableGroups"] == ["future/g"]
        assert any("future/g" in reason for reason in body["reasons"]), body
        await r.delete(metadata_key("future", "g"))
        await r.srem(f"{KEY_PREFIX}:groups", "future\0g")
        await eventually(up, 10, "health UP again", details=lambda: str(answers[-3:]))
        assert answers[-1]["unreadableGroups"] == []


# -- metrics port and compatibility failures -----------------------------------------


def test_the_metrics_listener_is_loopback_only() -> None:
    assert ServerSettings(metrics_listen="127.0.0.1:9464").metrics_address() == ("127.0.0.1", 9464)
    assert ServerSettings(metrics_listen="[::1]:9464").metrics_address() == ("::1", 9464)
    bad_ports = ("0.0.0.0:9464", "10.0.0.5:9464", "example.com:9464", "127.0.0.1", "x:y")
    for bad in (*bad_ports, "127.0.0.1:\u00b9"):  # a Unicode digit: not a port
        with pytest.raises(ValidationError, match="METRICS_LISTEN"):
            ServerSettings(metrics_listen=bad)


async def test_metrics_port_is_open_on_loopback_and_the_main_port_needs_read(
    ops: tuple[CoordinatorProcess, int],
) -> None:
    coord, port = ops
    text = await _loopback_metrics(port)
    for kind in ("redis_command", "coordination_version"):
        assert f'redis_stream_coord_command_compatibility_failure_total{{kind="{kind}"}}' in text
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(f"http://127.0.0.1:{port}/other")).status_code == 404
        assert (await http.post(f"http://127.0.0.1:{port}/metrics")).status_code == 405
        assert (await http.get(f"{coord.url}/metrics")).status_code == 401
        main = await http.get(f"{coord.url}/metrics", auth=READER)
        assert main.status_code == 200 and "redis_stream_coord_terminating" in main.text


async def test_refused_coordination_versions_and_redis_commands_are_counted(
    ops: tuple[CoordinatorProcess, int],
) -> None:
    coord, port = ops
    metric = "redis_stream_coord_command_compatibility_failure_total"
    before = await _loopback_metrics(port)
    async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
        assert (await _create(http, "compat", "g", coord.admin_auth)).status_code == 201
        hb = f"{API}/streams/compat/groups/g/members/m1/heartbeat"
        refused = await http.post(
            hb, json=join_body("m1", protocolVersion=99), auth=coord.member_auth
        )
        assert refused.json()["status"] == "UNSUPPORTED_PROTOCOL"
        # The coordinator's Redis user may not run XREVRANGE (an ACL change
        # after start-up): 503 with a code that says so, never a 500.
        messages = f"{API}/monitoring/streams/compat/groups/g/shards/0/messages"
        denied = await http.get(messages, params={"direction": "BACKWARD"}, auth=READER)
        assert denied.status_code == 503, denied.text
        assert denied.json()["errorCode"] == "REDIS_COMMAND_UNSUPPORTED"
        assert REDIS_PASSWORD not in denied.text
        forward = await http.get(messages, params={"direction": "FORWARD"}, auth=READER)
        assert forward.status_code == 200, forward.text
    after = await _loopback_metrics(port)
    for kind in ("coordination_version", "redis_command"):
        assert _sample(after, metric, kind=kind) == _sample(before, metric, kind=kind) + 1, kind
    assert REDIS_PASSWORD not in coord.log_path.read_text()


# -- audit stream ----------------------------------------------------------------------


async def test_audit_records_reach_a_capped_stream_and_a_broken_stream_fails_no_request(
    ops: tuple[CoordinatorProcess, int], r: Any
) -> None:
    coord, port = ops
    async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
        forbidden = await _create(http, "audit", "g", READER)
        assert forbidden.status_code == 403

        found = await _audited(
            r, lambda rec: rec["status"] == 403 and rec["streamPrefix"] == "audit"
        )
        assert found["principal"] == "reader" and found["action"] == "createCoordinatorGroup"
        assert found["kind"] == "refusal" and found["bodySha256"]
        # Capped: far more refusals than MAXLEN leave about MAXLEN entries
        # (approximate trimming keeps at most one extra radix-tree node).
        for _ in range(300):
            assert (await http.get(f"{API}/monitoring/groups")).status_code == 401
        marker = {"X-Request-Id": "cap-marker"}
        assert (await http.get(f"{API}/monitoring/groups", headers=marker)).status_code == 401
        await _audited(r, lambda rec: rec["requestId"] == "cap-marker")
        assert AUDIT_MAXLEN <= await r.xlen(AUDIT_KEY) <= AUDIT_MAXLEN + 100

        # The stream key taken by something else: every XADD fails, no request does.
        failures = "redis_stream_coord_audit_stream_failure_total"
        before = _sample(await _loopback_metrics(port), failures, reason="redis_error")
        await r.delete(AUDIT_KEY)
        await r.set(AUDIT_KEY, "not a stream")
        for _ in range(3):
            assert (await http.get(f"{API}/monitoring/groups")).status_code == 401
        assert (await http.get(f"{API}/monitoring/groups", auth=READER)).status_code == 200
        await eventually(
            lambda: _sample_async(port, failures, reason="redis_error", at_least=before + 3),
            10, "the failed copies counted",
        )  # fmt: skip
        assert await r.type(AUDIT_KEY) == b"string"
        await r.delete(AUDIT_KEY)
        assert (await http.get(f"{API}/monitoring/groups")).status_code == 401
        await eventually(lambda: _xlen_at_least(r, 1), 10, "records flow again")
    assert "audit records not copied to the Redis stream" in coord.log_path.read_text()


async def _audited(r: Any, match: Any) -> dict[str, Any]:
    """The first record in the audit stream ``match`` accepts (waits for it)."""
    found: list[dict[str, Any]] = []

    async def check() -> bool:
        for _, fields in await r.xrange(AUDIT_KEY):
            parsed: dict[str, Any] = json.loads(fields[b"record"])
            if match(parsed):
                assert fields[b"coordinatorId"].startswith(b"coord-")
                found.append(parsed)
                return True
        return False

    await eventually(check, 10, "the record in the audit stream")
    return found[0]


async def _sample_async(port: int, name: str, *, at_least: float, **labels: str) -> bool:
    return _sample(await _loopback_metrics(port), name, **labels) >= at_least


async def _xlen_at_least(r: Any, n: int) -> bool:
    return bool(await r.exists(AUDIT_KEY)) and int(await r.xlen(AUDIT_KEY)) >= n


# -- rate limits -----------------------------------------------------------------------


async def test_heartbeats_beyond_the_group_limit_get_429_with_retry_after(
    ops: tuple[CoordinatorProcess, int],
) -> None:
    coord, _ = ops
    async with httpx.AsyncClient(base_url=coord.url, timeout=10, auth=coord.member_auth) as http:
        assert (await _create(http, "limits", "hb", coord.admin_auth)).status_code == 201
        statuses = []
        for n in range(HB_LIMIT + 1):
            answer = await http.post(
                f"{API}/streams/limits/groups/hb/members/m{n}/heartbeat", json=join_body(f"m{n}")
            )
            statuses.append(answer.status_code)
        assert statuses == [200] * HB_LIMIT + [429], statuses
        body = answer.json()
        assert body == {"status": "429", "errorCode": "TOO_MANY_REQUESTS",
                        "message": body["message"]}  # fmt: skip
        # The rest of the 10 s heartbeat-interval window, rounded up.
        assert 1 <= int(answer.headers["retry-after"]) <= 10
        # Per group: another group's members are not limited.
        assert (await _create(http, "limits", "other", coord.admin_auth)).status_code == 201
        other = await http.post(
            f"{API}/streams/limits/groups/other/members/m0/heartbeat", json=join_body("m0")
        )
        assert other.status_code == 200


async def test_admin_mutations_beyond_the_principal_limit_get_429_with_retry_after(
    ops: tuple[CoordinatorProcess, int],
) -> None:
    coord, _ = ops
    async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
        statuses = [(await _create(http, "writes", f"g{n}", WRITER)).status_code
                    for n in range(ADMIN_LIMIT)]  # fmt: skip
        assert statuses == [201] * ADMIN_LIMIT
        over = await _create(http, "writes", "one-more", WRITER)
        assert over.status_code == 429 and over.json()["errorCode"] == "TOO_MANY_REQUESTS"
        assert 1 <= int(over.headers["retry-after"]) <= 60
        # Per principal: the admin is not held back by the writer's count.
        with anyio.fail_after(10):
            assert (await _create(http, "writes", "by-admin", coord.admin_auth)).status_code == 201


async def test_rollback_witnesses_are_counted_and_ignored_ones_audited(
    ops: tuple[CoordinatorProcess, int], r: Any
) -> None:
    """A member credential claiming a rollback for a member id the group does
    not know changes nothing, is counted as ignored and leaves an audit record;
    a live member's plausible claim is counted as accepted."""
    coord, port = ops
    name = "redis_stream_coord_rollback_witnesses_total"
    before = await _loopback_metrics(port)
    async with httpx.AsyncClient(base_url=coord.url, timeout=10, auth=coord.member_auth) as http:
        assert (await _create(http, "witness", "forged", coord.admin_auth)).status_code == 201
        url = f"{API}/streams/witness/groups/forged/members"
        forged = await http.post(
            f"{url}/ghost/heartbeat",
            json=join_body("ghost", memberEpoch=7, metadataVersion=2**62, incarnation="ab" * 8),
        )
        assert forged.status_code == 200
        assert forged.json()["status"] == "UNKNOWN_MEMBER_ID"
        # No correction round: a real member joining is granted shards at once.
        joined = await http.post(f"{url}/m0/heartbeat", json=join_body("m0"))
        assert joined.json()["status"] == "OK", joined.json()
        body = joined.json()
        member_epoch = body["memberEpoch"]
        assert [s["shardIndex"] for s in body["assignment"]["assignedShards"]] == [0, 1]
        record = await _audited(
            r, lambda rec: rec.get("kind") == "ignored-witness" and rec["memberId"] == "ghost"
        )
        assert record["verdict"] == "unknown-member"
        assert record["claimedVersion"] == 2**62 and record["storedEpoch"] is None
        assert (record["streamPrefix"], record["consumerGroup"]) == ("witness", "forged")

        # The live member's own report of a version a little ahead: accepted.
        claim = body["metadataVersion"] + 3
        ahead = await http.post(
            f"{url}/m0/heartbeat",
            json=join_body("m0", memberEpoch=member_epoch, metadataVersion=claim),
        )
        assert ahead.status_code == 200, ahead.text
    after = await _loopback_metrics(port)
    for verdict in ("unknown-member", "accepted"):
        assert _sample(after, name, verdict=verdict) == _sample(before, name, verdict=verdict) + 1
