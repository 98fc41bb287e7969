"""Bounded everything a caller sends (issue 36, findings 3 and 12).

A real coordinator process over real HTTP: header size (request id included),
the shape of ``X-Request-Id`` in the audit trail, the size of every audit
record, and read deadlines for headers and bodies (slowloris).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from server.sim import API

from streamkit.testing.coordinator import CoordinatorProcess
from streamkit.testing.redis_server import RedisServer
from streamkit_server.api.audit import MAX_RECORD_BYTES

AUDIT = "audit:bounds"


@pytest.fixture(scope="module")
def bounds_redis() -> Iterator[RedisServer]:
    """A Redis of this module's own: its coordinator runs production timings,
    which may not join the shared Redis's coordinators (other timings)."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def guarded(bounds_redis: RedisServer) -> Iterator[CoordinatorProcess]:
    with CoordinatorProcess(
        bounds_redis.url,
        env={
            "STREAMKIT_SERVER_AUDIT_STREAM": AUDIT,
            "STREAMKIT_SERVER_HEADER_TIMEOUT_MS": "1000",
            "STREAMKIT_SERVER_BODY_TIMEOUT_MS": "1000",
        },
    ) as proc:
        yield proc


@pytest.fixture
async def r(bounds_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A client of the module's Redis, the audit stream emptied first."""
    client = aioredis.from_url(bounds_redis.url)
    try:
        await client.delete(AUDIT)
        yield client
    finally:
        await client.aclose()


async def _records(r: aioredis.Redis, after: str = "-") -> list[dict[str, Any]]:
    entries = await r.xrange(AUDIT, after, "+")
    return [json.loads(fields[b"record"]) for _, fields in entries]


async def _settled(r: aioredis.Redis, count: int) -> list[dict[str, Any]]:
    # The audit stream is written off the request path: wait for it.
    for _ in range(100):
        records = await _records(r)
        if len(records) >= count:
            return records
        await asyncio.sleep(0.05)
    return await _records(r)


async def test_a_4mb_request_id_leaves_redis_memory_alone(
    guarded: CoordinatorProcess, r: aioredis.Redis
) -> None:
    before = (await r.info("memory"))["used_memory"]
    huge = "x" * (4 * 1024 * 1024)
    async with httpx.AsyncClient(base_url=guarded.url, timeout=10) as http:
        for _ in range(5):
            try:
                answer = await http.get(f"{API}/monitoring/groups", headers={"X-Request-Id": huge})
            except httpx.TransportError:
                continue  # cut off while still sending: refused all the same
            assert answer.status_code == 431
            assert answer.json()["errorCode"] == "REQUEST_HEADER_FIELDS_TOO_LARGE"
        # The server still answers everyone else.
        assert (await http.get("/livez")).status_code == 204
    grown = (await r.info("memory"))["used_memory"] - before
    assert grown < 1024 * 1024, grown
    for record in await _records(r):
        assert len(json.dumps(record)) <= MAX_RECORD_BYTES


# The heartbeat too: it once entered the app below the request-id middleware.
@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/monitoring/groups"), ("POST", "/streams/s/groups/g/members/m/heartbeat")],
)
async def test_request_ids_are_kept_only_in_a_safe_shape(
    guarded: CoordinatorProcess, r: aioredis.Redis, method: str, path: str
) -> None:
    ids = ["ok-1.2:3_x", "<script>", "y" * 129, "z" * 10_000, "a b", "é"]
    async with httpx.AsyncClient(base_url=guarded.url, timeout=10) as http:
        for rid in ids:
            # Unauthenticated: refused (401) and so audited.
            answer = await http.request(
                method,
                f"{API}{path}",
                headers={"X-Request-Id": rid.encode()},  # bytes go out as they are
            )
            assert answer.status_code == 401
    records = await _settled(r, len(ids))
    kept = [rec["requestId"] for rec in records]
    assert kept[0] == "ok-1.2:3_x"
    for rid in kept[1:]:
        assert rid.startswith("gen-") and len(rid) == 20


async def test_every_audit_record_is_size_bounded(
    guarded: CoordinatorProcess, r: aioredis.Redis
) -> None:
    long_name = "u" * 12_000  # a Basic user name just under the header limit
    async with httpx.AsyncClient(base_url=guarded.url, timeout=10) as http:
        answer = await http.get(f"{API}/monitoring/groups", auth=(long_name, "pw"))
        assert answer.status_code == 401
        prefix = "p" * 200
        answer = await http.post(
            f"{API}/streams/{prefix}",
            json={"requestedBy": "b" * 100_000, "reason": "r" * 100_000},
            auth=guarded.admin_auth,
        )
        assert answer.status_code in (201, 400, 409), answer.text
    records = await _settled(r, 2)
    assert len(records) >= 2
    for record in records:
        assert len(json.dumps(record).encode()) <= MAX_RECORD_BYTES
    # Refused (requestedBy is too long) or created: audited with cut fields.
    (create,) = [rec for rec in records if rec["streamPrefix"] == prefix]
    assert create["truncated"] is True and len(create["requestedBy"]) == 257


async def _raw(guarded: CoordinatorProcess) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", guarded.port)


async def test_slow_headers_are_cut_off(guarded: CoordinatorProcess) -> None:
    started = time.monotonic()
    silent = await _raw(guarded)  # opens and never sends a byte
    slow = await _raw(guarded)
    slow[1].write(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
    await slow[1].drain()
    for reader, writer in (silent, slow):
        # Held for the header deadline (1 s), then closed: EOF, not an answer.
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""
        writer.close()
    assert time.monotonic() - started < 8


@pytest.mark.parametrize(
    "target", ["/streams/{name}", "/streams/{name}/groups/g/members/m/heartbeat"]
)
async def test_a_slow_body_is_cut_off(guarded: CoordinatorProcess, target: str) -> None:
    # The heartbeat route reads its body itself (api/members.py): cut off too.
    reader, writer = await _raw(guarded)
    path = API + target.format(name=f"slow{uuid.uuid4().hex[:6]}")
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        f"content-length: 100\r\n\r\n{{".encode()
    )
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), head
    error = json.loads(body)
    assert error["errorCode"] == "REQUEST_TIMEOUT" and error["status"] == "408"
