"""Helpers of the resharding tests: admin calls over HTTP and a raw-HTTP consumer.

``SimConsumer`` is a member that speaks the heartbeat protocol over raw HTTP
(``tests.server.sim.SimMember``) and reads its shards with plain
``XREADGROUP``/``XACK`` on real Redis: enough of a consumer to drain shards in
server-level tests without depending on the consumer runtime.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import helpers
import httpx
from helpers import eventually as eventually
from server.sim import SimMember

from streamkit.testing import AsyncRedisClient
from streamkit.testing.coordinator import CoordinatorProcess

#: Server-side producer routing lease of the coordinators these tests start.
PRODUCER_LEASE_MS = 1_500
COORDINATOR_ENV = {"STREAMKIT_SERVER_PRODUCER_ROUTING_LEASE_MS": str(PRODUCER_LEASE_MS)}


class Admin(helpers.Admin):
    """The shared admin client plus the resharding calls, on the test's HTTP client."""

    def __init__(self, http: httpx.AsyncClient, coordinator: CoordinatorProcess) -> None:
        super().__init__(coordinator, http)
        self.http: httpx.AsyncClient = http

    async def scale(self, prefix: str, target: int, **extra: Any) -> httpx.Response:
        body = {"targetShardCount": target, "requestedBy": "tests", "reason": "test", **extra}
        return await self.post(f"/streams/{prefix}/scale", body)

    async def scale_ok(self, prefix: str, target: int, **extra: Any) -> str:
        r = await self.scale(prefix, target, **extra)
        assert r.status_code == 202, r.text
        rid: str = r.json()["migrations"][0]["reshardingId"]
        return rid

    async def migration(self, prefix: str, group: str, rid: str) -> dict[str, Any]:
        r = await self.get(f"/streams/{prefix}/groups/{group}/migrations/{rid}")
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    async def rollback(self, prefix: str, group: str, rid: str) -> httpx.Response:
        return await self.post(
            f"/streams/{prefix}/groups/{group}/migrations/{rid}/rollback",
            {"requestedBy": "tests", "reason": "test"},
        )

    async def routing(self, prefix: str, group: str) -> dict[str, Any]:
        r = await self.get(f"/streams/{prefix}/groups/{group}/producer-routing")
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    async def group(self, prefix: str, group: str) -> dict[str, Any]:
        r = await self.get(f"/monitoring/streams/{prefix}/groups/{group}")
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    async def wait_state(
        self, prefix: str, groups: list[str], rid: str, state: str, within: float = 20.0
    ) -> None:
        seen: dict[str, str] = {}

        async def reached() -> bool:
            for group in groups:
                seen[group] = (await self.migration(prefix, group, rid))["state"]
            return all(s == state for s in seen.values())

        try:
            await eventually(reached, within, f"migration {rid} {state}", interval=0.1)
        except AssertionError as exc:
            details = [(await self.get("/monitoring/health")).text]
            for group in groups:
                base = f"/monitoring/streams/{prefix}/groups/{group}"
                for view in ("assignments", "members", "migrations"):
                    details.append(f"{group} {view}: {(await self.get(f'{base}/{view}')).text}")
            raise AssertionError(
                f"{exc}; states: {seen}\n" + "\n".join(details) + "\n" + self.coordinator.logs(40)
            ) from None


class SimConsumer:
    """A raw-HTTP member that reads and acks the shards it is told to read."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        coordinator: CoordinatorProcess,
        redis: AsyncRedisClient,
        prefix: str,
        group: str,
        member_id: str,
        *,
        ack: bool = True,
    ) -> None:
        self.member = SimMember(http, coordinator.url, prefix, group, member_id)
        self.redis = redis
        self.prefix = prefix
        self.group = group
        self.ack = ack
        #: "key/id" -> times handled
        self.handled: Counter[str] = Counter()
        #: Owned shards not to read for now (to keep a backlog in place).
        self.skip: set[int] = set()
        self._claimed: set[int] = set()

    async def step(self) -> None:
        """One heartbeat, then read (and ack) every owned shard once."""
        body = self.member.body()
        try:
            r = await self.member.post(body)
        except httpx.HTTPError:
            return  # the coordinator is restarting: try again next step
        if r.status_code == 503:
            return  # a coordinator that cannot reach Redis right now: retry
        # Anything else is an answer the tests must see, not retry past.
        assert r.status_code == 200, f"{self.member.member_id}: heartbeat answered {r.text}"
        data: dict[str, Any] = r.json()
        assert data["responseTo"] == body["requestId"], (data, body)
        self.member.apply(data, body)
        self._claimed &= self.member.owned
        for shard in sorted(self.member.owned - self.skip):
            key = f"{self.prefix}:{shard}"
            if shard not in self._claimed:
                # Entries a previous owner read but never acked.
                _, entries, *_ = await self.redis.xautoclaim(
                    key, self.group, self.member.member_id, 0, "0-0", count=1000
                )
                self._claimed.add(shard)
                await self._handle(key, [e for e in entries if e[1] is not None])
            reply = await self.redis.xreadgroup(
                self.group, self.member.member_id, {key: ">"}, count=500
            )
            for _, entries in reply or []:
                await self._handle(key, entries)

    async def _handle(self, key: str, entries: list[Any]) -> None:
        for entry_id, _fields in entries:
            self.handled[f"{key}/{entry_id}"] += 1
        if self.ack and entries:
            await self.redis.xack(key, self.group, *[e[0] for e in entries])

    async def run(self, stop: anyio.Event, interval: float = 0.1) -> None:
        while not stop.is_set():
            await self.step()
            with anyio.move_on_after(interval):
                await stop.wait()
