"""Test an app against real parts: :class:`StreamKitHarness`.

One harness per test: a fresh stream prefix and group on the session's real
``redis-server`` and coordinator.  It builds apps configured for them, runs
an app in the test's event loop until its members own every shard, publishes,
waits until everything published was handled and acked (``drain``), reads
the dead-letter stream, and kills and restarts members.  The pytest plugin
(``streamkit.testing.plugin``) provides it as the ``streamkit_harness`` fixture.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx

from streamkit.app import StreamKit
from streamkit.consumer.failure import dead_letter_key
from streamkit.consumer.lifecycle import monotonic_ms
from streamkit.consumer.runtime import MemberRuntime
from streamkit.publisher.publisher import Publisher
from streamkit.results import PublishResult
from streamkit.testing import RedisTarget, redis_client
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit.testing.members import crash_member, restart_member

__all__ = ["StreamKitHarness"]


class StreamKitHarness:
    """A stream/group of this test on real Redis and a real coordinator."""

    def __init__(
        self,
        coordinator: CoordinatorProcess,
        redis_url: str,
        *,
        stream_prefix: str | None = None,
        group: str = "app",
        shards: int = 2,
    ) -> None:
        self.coordinator = coordinator
        self.redis_url = redis_url
        self.stream_prefix = stream_prefix or f"test-{uuid.uuid4().hex[:10]}"
        self.group = group
        self.shards = shards
        self._created = False
        self._publisher: Publisher | None = None
        self._apps: list[StreamKit] = []

    # -- set-up --------------------------------------------------------------

    @property
    def settings(self) -> dict[str, Any]:
        """``StreamKit(**harness.settings)``: the session's Redis and coordinator."""
        user, password = self.coordinator.admin_auth
        return {
            "coordinator_url": self.coordinator.url,
            "coordinator_username": user,
            "coordinator_password": password,
            "redis_url": self.redis_url,
            "member_id_base": f"t{uuid.uuid4().hex[:6]}",
        }

    async def create_group(self) -> None:
        """Create this test's group (done by the fixture; idempotent)."""
        if self._created:
            return
        async with httpx.AsyncClient(auth=self.coordinator.admin_auth, timeout=10) as http:
            response = await http.post(
                f"{self.coordinator.url}/coord/v1/streams/{self.stream_prefix}/groups/{self.group}",
                json={"initialShardCount": self.shards, "requestedBy": "tests", "reason": "test"},
            )
        if response.status_code not in (200, 201):
            raise RuntimeError(f"creating the test group failed: {response.text}")
        self._created = True

    def app(self, **overrides: Any) -> StreamKit:
        """A ``StreamKit`` app on the session's Redis and coordinator."""
        return StreamKit(**{**self.settings, **overrides})

    # -- running -------------------------------------------------------------

    @asynccontextmanager
    async def running(self, app: StreamKit, *, within: float = 10.0) -> AsyncIterator[StreamKit]:
        """Serve ``app`` in this event loop; entered once its members own every shard
        of this test's group; on exit it drains and leaves, as on SIGTERM."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(app.serve)
            self._apps.append(app)
            try:
                await self.settled(app, within=within)
                yield app
            finally:
                self._apps.remove(app)
                app.shutdown()

    async def settled(self, app: StreamKit, *, within: float = 10.0) -> None:
        """Wait until the app's live members own every shard of this test's group
        (after ``running``, ``kill_member`` or ``restart_member``)."""
        with anyio.fail_after(within):
            # Polled: ownership changes inside member state machines, which
            # have no event to wait on.
            while not self._owns_all(app):  # noqa: ASYNC110
                await anyio.sleep(0.01)

    def kill_member(self, app: StreamKit, index: int = 0) -> MemberRuntime:
        """Kill one member of a running app as ``kill -9`` would kill its process:
        no drain, no acks, no leave.  The coordinator gives its shards to the
        other members once its member lease runs out (``settled`` waits for
        that); entries it had not acked are delivered again.  Returns it."""
        return crash_member(app, self._members(app)[index])

    def restart_member(self, app: StreamKit, killed: MemberRuntime) -> MemberRuntime:
        """Start a member in place of a killed one, as a restarted process would
        (a new member id, unless membership is static).  Returns the new member."""
        return restart_member(app, killed)

    def _members(self, app: StreamKit) -> list[MemberRuntime]:
        key = (self.stream_prefix, self.group)
        return [m for m in app.members if (m.stream_prefix, m.consumer_group) == key]

    def _owns_all(self, app: StreamKit) -> bool:
        now = monotonic_ms()
        owned: set[int] = set()
        for member in self._members(app):
            if not member.crashed:
                owned |= member.machine.readable(now)
        return len(owned) == self.shards

    # -- publishing ----------------------------------------------------------

    async def publish(self, partition_key: str | bytes, fields: Any) -> PublishResult:
        """Publish to this test's stream (a publisher of the harness' own)."""
        if self._publisher is None:
            self._publisher = Publisher(
                self.stream_prefix, self.group, settings=self.app().settings
            )
        return await self._publisher.publish(partition_key, fields)

    async def drain(self, within: float = 10.0) -> None:
        """Wait until every entry of every shard was delivered and acked (or dead-lettered)."""
        redis = redis_client(RedisTarget(self.redis_url, cluster=False))
        deadline = time.monotonic() + within
        try:
            while not await self._drained(redis):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.stream_prefix}/{self.group} not drained")
                await anyio.sleep(0.01)
        finally:
            await redis.aclose()

    async def _drained(self, redis: Any) -> bool:
        for shard in range(self.shards):
            key = f"{self.stream_prefix}:{shard}"
            groups = await redis.xinfo_groups(key)
            info = next((g for g in groups if _text(g["name"]) == self.group), None)
            if info is None or info["pending"] or (info.get("lag") or 0):
                return False
            if info.get("lag") is None:  # Redis could not tell: compare ids
                last = (await redis.xinfo_stream(key))["last-generated-id"]
                if _text(info["last-delivered-id"]) != _text(last):
                    return False
        return True

    async def dead_letters(self) -> list[dict[str, str]]:
        """The group's dead-letter entries (decoded), oldest first."""
        redis = redis_client(RedisTarget(self.redis_url, cluster=False))
        try:
            key = dead_letter_key(self.stream_prefix, self.group)
            entries: Any = await redis.xrange(key)
        finally:
            await redis.aclose()
        return [{_text(k): _text(v) for k, v in fields.items()} for _, fields in entries]

    async def aclose(self) -> None:
        if self._publisher is not None:
            await self._publisher.aclose()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
