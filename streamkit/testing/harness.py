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
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
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

__all__ = ["TEST_SETTINGS", "Handled", "StreamKitHarness"]

#: What ``harness.app()`` sets unless the test overrides it: a failed handler is
#: retried after 1 ms (then up to 20 ms), not after the production 200 ms..30 s.
TEST_SETTINGS: dict[str, Any] = {"retry_backoff_ms": 1, "retry_backoff_max_ms": 20}


@dataclass(frozen=True, slots=True)
class Handled:
    """What became of one entry ``send`` published: acked, or dead-lettered."""

    result: PublishResult
    #: The dead-letter entry (decoded), or None when the entry was acked.
    dead_letter: dict[str, str] | None

    @property
    def dead_lettered(self) -> bool:
        return self.dead_letter is not None

    @property
    def error(self) -> str | None:
        """The dead letter's ``x-error`` (None when acked)."""
        return None if self.dead_letter is None else self.dead_letter.get("x-error")


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
        self._redis: Any = None
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
        """A ``StreamKit`` app on the session's Redis and coordinator, retrying
        failed handlers after milliseconds (``TEST_SETTINGS``; override them here)."""
        return StreamKit(**{**self.settings, **TEST_SETTINGS, **overrides})

    def listen(self, app: StreamKit, handler: Callable[..., Any], **options: Any) -> None:
        """Register ``handler`` on this test's stream and group (``stream_listener`` options)."""
        app.stream_listener(stream_prefix=self.stream_prefix, group=self.group, **options)(handler)

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

    async def send(self, partition_key: str | bytes, fields: Any, within: float = 10.0) -> Handled:
        """Publish one entry and wait until the running app handled it: acked, or
        dead-lettered after its retries.  No sleeps in the test, no ``drain``."""
        result = await self.publish(partition_key, fields)
        redis = self._client()
        deadline = time.monotonic() + within
        # Polled: the ack is a Redis state another task sends in a batch; a
        # dead letter's XADD goes before its XACK, so "acked" covers both.
        while not await self._settled(redis, result):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"entry {result.record_id} of {result.stream_key} was not handled "
                    f"within {within:g} s (is the app running, `async with harness.running(app)`? "
                    "does a handler that takes the Message ack it?)"
                )
            await anyio.sleep(0.002)
        letter = next(
            (x for x in await self.dead_letters() if x.get("x-original-id") == result.record_id),
            None,
        )
        return Handled(result, letter)

    async def _settled(self, redis: Any, result: PublishResult) -> bool:
        key, entry = result.stream_key, result.record_id
        if await redis.xpending_range(key, self.group, min=entry, max=entry, count=1):
            return False
        groups = await redis.xinfo_groups(key)
        info = next((g for g in groups if _text(g["name"]) == self.group), None)
        return info is not None and _id(_text(info["last-delivered-id"])) >= _id(entry)

    async def drain(self, within: float = 10.0) -> None:
        """Wait until every entry of every shard was delivered and acked (or dead-lettered)."""
        redis = self._client()
        deadline = time.monotonic() + within
        while not await self._drained(redis):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.stream_prefix}/{self.group} not drained")
            await anyio.sleep(0.005)

    @property
    def redis(self) -> Any:
        """A Redis client of this test (on the session's server), to inspect streams."""
        return self._client()

    def _client(self) -> Any:
        # One client per test, made in its event loop on first use.
        if self._redis is None:
            self._redis = redis_client(RedisTarget(self.redis_url, cluster=False))
        return self._redis

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
        key = dead_letter_key(self.stream_prefix, self.group)
        entries: Any = await self._client().xrange(key)
        return [{_text(k): _text(v) for k, v in fields.items()} for _, fields in entries]

    async def aclose(self) -> None:
        if self._publisher is not None:
            await self._publisher.aclose()
        if self._redis is not None:
            await self._redis.aclose()


def _id(entry: str) -> tuple[int, int]:
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq or 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
