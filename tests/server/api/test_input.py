"""Bad input is answered 4xx ErrorResponse, never 500, and writes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from helpers import join_body as _hb

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from ..sim import API, SimMember, create_group, hb_path, meta_key, redis_of

HB = hb_path("input", "g", "m1")
GROUP = f"{API}/streams/input/groups/g"
MON = f"{API}/monitoring/streams/input/groups/g"


async def _chunks(size: int) -> AsyncIterator[bytes]:
    for _ in range(size // 65536):
        yield b" " * 65536


# (method, path, kwargs, expected status, expected errorCode, text the message must name)
CASES: list[tuple[str, str, dict[str, Any], int, str, str]] = [
    ("POST", HB, {"json": _hb(memberEpoch="x")}, 400, "INVALID_REQUEST", "memberEpoch"),
    ("POST", HB, {"json": _hb(memberEpoch=True)}, 400, "INVALID_REQUEST", "memberEpoch"),
    ("POST", HB, {"json": _hb(memberEpoch=1.5)}, 400, "INVALID_REQUEST", "memberEpoch"),
    ("POST", HB, {"json": _hb(requestId=None)}, 400, "INVALID_REQUEST", "requestId"),
    ("POST", HB, {"json": _hb(protocolVersion=0)}, 400, "INVALID_REQUEST", "protocolVersion"),
    ("POST", HB, {"json": _hb(memberEpoch=2**63)}, 400, "INVALID_REQUEST", "memberEpoch"),
    (
        "POST", HB,
        {"json": _hb(revokingShards=[{"shard": {"shardIndex": 1}, "state": "BOGUS"}])},
        400, "INVALID_REQUEST", "state",
    ),
    (
        "POST", HB, {"json": _hb(ownedShards=[{"shardIndex": 1}, {"shardIndex": 1}])},
        400, "INVALID_REQUEST", "duplicate",
    ),
    ("POST", HB, {"json": _hb(ownedShards=[{"shardIndex": -1}])}, 400, "INVALID_REQUEST",
     "shardIndex"),
    ("POST", HB, {"json": [1, 2]}, 400, "INVALID_REQUEST", "body"),
    ("POST", HB, {"content": b"{not json", "headers": {"content-type": "application/json"}},
     400, "MALFORMED_JSON", "JSON"),
    ("POST", HB, {"content": b'{"a":1}'}, 400, "INVALID_REQUEST", "body"),
    # What `curl -d` sends: JSON text declared as a form. The message names the header.
    ("POST", GROUP, {"content": b'{"initialShardCount": 2, "requestedBy": "t"}',
                     "headers": {"content-type": "application/x-www-form-urlencoded"}},
     400, "INVALID_REQUEST", "'Content-Type: application/json' (Content-Type was "
     "'application/x-www-form-urlencoded')"),
    ("POST", GROUP, {"content": b'{"initialShardCount": 2, "requestedBy": "t"}'},
     400, "INVALID_REQUEST", "'Content-Type: application/json' (Content-Type was none)"),
    ("POST", HB, {"content": b"x" * (2 << 20), "headers": {"content-type": "application/json"}},
     413, "PAYLOAD_TOO_LARGE", "limit"),
    ("POST", HB, {"chunked": 2 << 20, "headers": {"content-type": "application/json"}},
     413, "PAYLOAD_TOO_LARGE", "large"),
    ("POST", hb_path("in%7Bput", "g", "m1"), {"json": _hb()}, 400, "INVALID_STREAM_PREFIX", "{"),
    ("POST", hb_path("input", "a:b", "m1"), {"json": _hb()}, 400, "INVALID_CONSUMER_GROUP", ":"),
    ("POST", hb_path("x" * 201, "g", "m1"), {"json": _hb()}, 400, "INVALID_STREAM_PREFIX", "200"),
    ("POST", hb_path("input", "g%20x", "m1"), {"json": _hb()}, 400, "INVALID_CONSUMER_GROUP",
     "whitespace"),
    ("GET", HB, {}, 405, "METHOD_NOT_ALLOWED", "GET"),
    ("GET", f"{API}/nope", {}, 404, "NOT_FOUND", "/nope"),
    ("POST", GROUP, {"json": {"initialShardCount": 0, "requestedBy": "t"}}, 400,
     "INVALID_REQUEST", "initialShardCount"),
    ("POST", GROUP, {"json": {"initialShardCount": 2}}, 400, "INVALID_REQUEST", "requestedBy"),
    ("DELETE", GROUP, {}, 400, "INVALID_REQUEST", "body"),
    ("GET", f"{MON}/shards/abc/messages", {}, 400, "INVALID_REQUEST", "shardIndex"),
    ("GET", f"{MON}/shards/0/messages?limit=0", {}, 400, "INVALID_REQUEST", "limit"),
    ("GET", f"{MON}/shards/0/messages?limit=1001", {}, 400, "INVALID_REQUEST", "limit"),
    ("GET", f"{MON}/shards/0/messages?direction=UP", {}, 400, "INVALID_REQUEST", "direction"),
    ("GET", f"{MON}/shards/0/messages?cursor=bad", {}, 400, "INVALID_CURSOR", "cursor"),
    ("GET", f"{MON}/shards/9/messages", {}, 404, "SHARD_NOT_FOUND", "9"),
]  # fmt: skip


@pytest.fixture
async def prepared(coordinator: CoordinatorProcess, any_redis: RedisTarget) -> CoordinatorProcess:
    async with httpx.AsyncClient() as http:
        await create_group(http, coordinator, "input", "g", 2)
        member = SimMember(http, coordinator.url, "input", "g", "m1")
        await member.heartbeat()
        # Gone again: a live member's lease would run out during a slow run,
        # and the tick's write would look like a write by a bad request.
        await member.heartbeat(epoch=-1, owned=[])
    return coordinator


async def test_bad_input_is_a_4xx_error_response_and_writes_nothing(
    prepared: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    key = meta_key("input", "g")
    async with (
        httpx.AsyncClient(auth=prepared.admin_auth, timeout=10) as http,
        redis_of(any_redis) as r,
    ):
        revision = await r.hget(key, "revision")
        for method, path, kwargs, status, code, needle in CASES:
            kwargs = dict(kwargs)
            if "chunked" in kwargs:  # no Content-Length: counted while read
                kwargs["content"] = _chunks(kwargs.pop("chunked"))
            response = await http.request(method, f"{prepared.url}{path}", **kwargs)
            assert response.status_code == status, (method, path, response.text)
            body = response.json()
            assert body["status"] == str(status), body
            assert body["errorCode"] == code, (path, body)
            assert needle.lower() in body["message"].lower(), (path, body)
        assert await r.hget(key, "revision") == revision
        assert await r.keys("in{put*") == []


async def test_decisions_on_wellformed_but_wrong_heartbeats(
    prepared: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    async with httpx.AsyncClient(auth=prepared.member_auth) as http:
        url = f"{prepared.url}{HB}"
        unsupported = (await http.post(url, json=_hb(protocolVersion=99))).json()
        assert unsupported["status"] == "UNSUPPORTED_PROTOCOL"
        mismatch = (await http.post(url, json=_hb(memberId="other"))).json()
        assert mismatch["status"] == "INVALID_REQUEST"
        unknown = await http.post(url.replace("m1", "m9"), json=_hb(memberId="m9", memberEpoch=7))
        assert unknown.json()["status"] == "UNKNOWN_MEMBER_ID"
