"""The smaller findings of issue 36 (8, 9, 10, 14), against a real coordinator.

Readiness when Redis refuses the coordinator, cross-origin form posts with
cached Basic credentials, the audit record of a padded body, control and
format characters in member ids and names, ``.``/``..`` as names, no Host
header in a redirect, and no CDN-loading ``/docs`` by default.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
import redis.asyncio as aioredis
from helpers import join_body
from server.sim import API, hb_path

from streamkit.testing.coordinator import CoordinatorProcess
from streamkit.testing.redis_server import RedisServer

AUDIT = "audit:hardening"
REVOKE = f"{API}/admin/principals/admin/revoke-tokens"


@pytest.fixture(scope="module")
def coord(redis_server: RedisServer) -> Iterator[CoordinatorProcess]:
    with CoordinatorProcess(redis_server.url, env={"STREAMKIT_SERVER_AUDIT_STREAM": AUDIT}) as proc:
        yield proc


def _client(coord: CoordinatorProcess) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=coord.url, auth=coord.admin_auth, timeout=10)


def test_readyz_fails_when_redis_refuses_the_coordinator(
    private_redis_server: RedisServer,
) -> None:
    proc = CoordinatorProcess(private_redis_server.url)
    proc.start()
    try:
        assert httpx.get(f"{proc.url}/readyz").status_code == 204
        r = private_redis_server.client()
        r.config_set("requirepass", "changed-behind-its-back")
        r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        for _ in range(50):
            if httpx.get(f"{proc.url}/readyz").status_code == 503:
                break
        assert httpx.get(f"{proc.url}/readyz").status_code == 503
    finally:
        proc.cleanup()


async def test_cross_origin_mutations_are_refused(coord: CoordinatorProcess) -> None:
    host = coord.url.removeprefix("http://")
    async with _client(coord) as http:
        # What a foreign page's form sends: form type, empty body, its Origin.
        form = {"content-type": "application/x-www-form-urlencoded"}
        for headers in (
            {**form, "origin": "https://evil.example"},
            {**form, "origin": "null"},
            {**form, "sec-fetch-site": "cross-site"},
        ):
            answer = await http.post(REVOKE, headers=headers)
            assert answer.status_code == 403, (headers, answer.text)
            error = answer.json()
            assert error["errorCode"] == "CROSS_ORIGIN_REQUEST" and error["status"] == "403"
        # Programs send no Origin; the console sends its own.
        assert (await http.post(REVOKE)).status_code == 200
        same = await http.post(REVOKE, headers={"origin": f"http://{host}"})
        assert same.status_code == 200, same.text
        # Reads are not changes.
        read = await http.get(
            f"{API}/monitoring/groups", headers={"origin": "https://evil.example"}
        )
        assert read.status_code == 200


async def test_the_audit_record_shows_what_a_padded_body_stored(
    coord: CoordinatorProcess, redis_server: RedisServer
) -> None:
    name = f"pad{uuid.uuid4().hex[:6]}"
    body = b" " * 70_000 + json.dumps({"requestedBy": "mallory", "reason": "padded"}).encode()
    async with _client(coord) as http:
        answer = await http.post(
            f"{API}/streams/{name}", content=body, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 201, answer.text
    r = aioredis.from_url(redis_server.url)
    try:
        for _ in range(100):
            records = [json.loads(f[b"record"]) for _, f in await r.xrange(AUDIT)]
            mine = [rec for rec in records if rec.get("streamPrefix") == name]
            if mine:
                break
            await asyncio.sleep(0.05)
        (record,) = mine
        assert record["requestedBy"] == "mallory" and record["reason"] == "padded"
    finally:
        await r.aclose()


@pytest.mark.parametrize("bad", ["\x00", "\x1b[2J", "\u0085", "\u202e", "\u2028"])
async def test_member_ids_and_names_refuse_control_and_format_characters(
    coord: CoordinatorProcess, bad: str
) -> None:
    prefix = f"cc{uuid.uuid4().hex[:6]}"
    base = join_body(requestId="r1")  # each case names its member
    async with _client(coord) as http:
        created = await http.post(
            f"{API}/streams/{prefix}/groups/g",
            json={"initialShardCount": 1, "requestedBy": "t"},
        )
        assert created.status_code == 201, created.text
        cases = [
            (hb_path(prefix, "g", "m1"), {**base, "memberId": "m1", "memberName": f"n{bad}"}),
            (hb_path(prefix, "g", quote(f"m{bad}")), {**base, "memberId": f"m{bad}"}),
            (hb_path(prefix, "g", "m1"), {**base, "memberId": "m1", "incarnation": f"i{bad}"}),
        ]
        for path, body in cases:
            answer = await http.post(path, json=body, auth=coord.member_auth)
            assert answer.status_code == 400, (path, body, answer.text)
            assert answer.json()["errorCode"] in ("INVALID_REQUEST", "INVALID_MEMBER_ID")
        members = await http.get(f"{API}/monitoring/streams/{prefix}/groups/g/members")
        assert members.status_code == 200 and bad not in members.text


async def test_dot_names_are_refused(coord: CoordinatorProcess) -> None:
    async with _client(coord) as http:
        for path, code in (
            (f"{API}/streams/%2E", "INVALID_STREAM_PREFIX"),
            (f"{API}/streams/%2E%2E", "INVALID_STREAM_PREFIX"),
            (f"{API}/streams/ok{uuid.uuid4().hex[:4]}/groups/%2E%2E", "INVALID_CONSUMER_GROUP"),
        ):
            answer = await http.post(path, json={"requestedBy": "t", "initialShardCount": 1})
            assert answer.status_code == 400, (path, answer.text)
            assert answer.json()["errorCode"] == code


async def test_no_host_header_in_a_redirect_and_no_cdn_docs(coord: CoordinatorProcess) -> None:
    async with _client(coord) as http:
        for path in (f"{API}/monitoring/groups/", "/console"):
            answer = await http.get(path, headers={"host": "evil.example"})
            assert "evil.example" not in answer.headers.get("location", ""), path
            assert "evil.example" not in answer.text
        docs = await http.get("/docs")
        assert docs.status_code == 404 and docs.json()["errorCode"] == "NOT_FOUND"
        assert (await http.get("/openapi.json")).status_code == 200
