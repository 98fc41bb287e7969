"""Simulated members speaking raw HTTP to a real coordinator, and small helpers."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import helpers
import httpx
from helpers import API, KEY_PREFIX, metadata_key

from streamkit.testing import AsyncRedisClient, RedisTarget, redis_client
from streamkit.testing.coordinator import (
    TEST_ADMIN_PASSWORD,
    TEST_ADMIN_USERNAME,
    CoordinatorProcess,
)

FENCED = {"UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH"}
# What every launched coordinator accepts on its (authenticated) member API.
MEMBER_AUTH = (TEST_ADMIN_USERNAME, TEST_ADMIN_PASSWORD)

__all__ = ["API", "KEY_PREFIX", "MEMBER_AUTH", "meta_key"]

meta_key = metadata_key


async def stored_group(r: AsyncRedisClient, prefix: str, group: str) -> dict[str, Any]:
    """The group as stored (layout v2): the group document plus one field per member."""
    raw = await r.hgetall(meta_key(prefix, group))
    document: dict[str, Any] = json.loads(raw["group"])
    document["members"] = {
        name[2:]: json.loads(value) for name, value in raw.items() if name.startswith("m:")
    }
    return document


async def snapshot(r: AsyncRedisClient, prefix: str, group: str) -> dict[str, str]:
    return dict(await r.hgetall(meta_key(prefix, group)))


async def restore(r: AsyncRedisClient, prefix: str, group: str, saved: dict[str, str]) -> None:
    """Put an older copy of the group back, as a failover that lost writes does."""
    key = meta_key(prefix, group)
    async with r.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        pipe.hset(key, mapping=saved)  # type: ignore[arg-type]
        await pipe.execute()


def hb_path(prefix: str, group: str, member_id: str) -> str:
    return f"{API}/streams/{prefix}/groups/{group}/members/{member_id}/heartbeat"


def shards(view: dict[str, Any], field: str = "assignedShards") -> list[int]:
    return [s["shardIndex"] for s in view["assignment"][field]]


@asynccontextmanager
async def redis_of(target: RedisTarget) -> AsyncIterator[AsyncRedisClient]:
    client = redis_client(target, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


async def create_group(
    http: httpx.AsyncClient, coord: CoordinatorProcess, prefix: str, group: str, shard_count: int
) -> dict[str, Any]:
    return await helpers.create_group(coord, prefix, group, shard_count, http=http)


async def metric(http: httpx.AsyncClient, coord: CoordinatorProcess, name: str) -> float:
    text = (await http.get(f"{coord.url}/metrics", auth=coord.admin_auth)).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if m:
            total += float(m.group(2))
    return total


class SimMember:
    """A member that follows the protocol the way the consumer runtime must.

    New reads start only on OK; shards that leave ``assignedShards`` stop being
    read at once and are drained; with ``auto_revoke`` a drained shard is
    reported REVOKED on the next heartbeat.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        prefix: str,
        group: str,
        member_id: str,
        *,
        auto_revoke: bool = True,
        incarnation: str | None = None,
        auth: tuple[str, str] | None = MEMBER_AUTH,
    ) -> None:
        self.http = http
        self.incarnation = incarnation
        # None: whatever credentials the client itself carries.
        self.auth = auth
        self.base_url = base_url
        self.prefix = prefix
        self.group = group
        self.member_id = member_id
        self.auto_revoke = auto_revoke
        self.epoch = 0
        self.version = 0
        self.owned: set[int] = set()
        self.draining: set[int] = set()
        self.pending: set[int] = set()
        self.last_status: str | None = None
        self._seq = 0

    def body(
        self,
        *,
        epoch: int | None = None,
        version: int | None = None,
        owned: Iterable[int] | None = None,
        revoked: Iterable[int] = (),
        draining: Iterable[int] | None = None,
    ) -> dict[str, Any]:
        self._seq += 1
        draining_set = set(self.draining if draining is None else draining)
        revoked_set = set(revoked)
        if self.auto_revoke and draining is None:
            revoked_set |= draining_set
            draining_set = set()
        revoking = [
            {"shard": {"shardIndex": s}, "state": "REVOKED", "inFlight": 0}
            for s in sorted(revoked_set)
        ] + [
            {"shard": {"shardIndex": s}, "state": "DRAINING", "inFlight": 1}
            for s in sorted(draining_set - revoked_set)
        ]
        return {
            "protocolVersion": 1,
            "requestId": f"{self.member_id}-{self._seq}",
            "memberId": self.member_id,
            "memberName": self.member_id,
            "memberEpoch": self.epoch if epoch is None else epoch,
            "metadataVersion": self.version if version is None else version,
            "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
            "ownedShards": [
                {"shardIndex": s} for s in sorted(self.owned if owned is None else owned)
            ],
            "revokingShards": revoking,
            **({"incarnation": self.incarnation} if self.incarnation else {}),
        }

    async def post(self, body: dict[str, Any], base_url: str | None = None) -> httpx.Response:
        url = f"{base_url or self.base_url}{hb_path(self.prefix, self.group, self.member_id)}"
        if self.auth is None:
            return await self.http.post(url, json=body)
        return await self.http.post(url, json=body, auth=self.auth)

    async def heartbeat(
        self, *, apply: bool = True, base_url: str | None = None, **overrides: Any
    ) -> dict[str, Any]:
        body = self.body(**overrides)
        r = await self.post(body, base_url)
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        assert data["responseTo"] == body["requestId"]
        if apply:
            self.apply(data, body)
        return data

    def apply(self, data: dict[str, Any], sent: dict[str, Any]) -> None:
        status = data["status"]
        self.last_status = status
        if status == "RETRY":
            return
        if status in FENCED:
            self.epoch, self.owned, self.draining, self.pending = 0, set(), set(), set()
            return
        if status in ("UNSUPPORTED_PROTOCOL", "INVALID_REQUEST"):
            return
        self.epoch = data["memberEpoch"]
        if self.epoch == -1:  # left
            self.owned, self.draining = set(), set()
            return
        self.version = data["metadataVersion"]
        # A REVOKED report that got an answer is done.
        for report in sent["revokingShards"]:
            if report["state"] == "REVOKED":
                self.draining.discard(report["shard"]["shardIndex"])
        assigned = set(shards(data))
        self.pending = set(shards(data, "pendingShards"))
        # Stop reading what is no longer assigned, at once.
        self.draining |= self.owned - assigned
        self.owned &= assigned
        if status == "OK":
            self.draining -= assigned
            self.owned = assigned
