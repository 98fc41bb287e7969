"""A member that cannot reach its shards' Redis gives them back, and rejoins
once Redis answers again.

* One app reaches Redis through a TCP forwarder that the test cuts: its
  heartbeats still succeed (the coordinator is fine), so only the new rule can
  make it let go; a healthy app in another "process" takes every shard, and
  gets half back once the path is restored.
* A real redis-server (append-only file, so a restart keeps the groups) is
  stopped under a running app and started again: the app leaves, waits, and
  handles new messages after the restart.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from tcp_forwarder import TcpForwarder

from streamkit import Message, StreamKit
from streamkit.protocol import MemberState
from streamkit.testing import HOST, RedisServer, RedisTarget, redis_client

from .support import Admin, eventually, in_process_settings, serving, settled_ownership

pytestmark = pytest.mark.slow

SHARDS = 4
RELEASE_AFTER_S = 0.5


class CuttableForwarder(TcpForwarder):
    """Forwards TCP to a Redis port until ``cut()`` closes the listener and
    every connection; ``restore()`` listens on the same port again."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self.port = 0
        self._open = False

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    async def restore(self) -> None:
        self._open = True
        self.port = await self.listen(self.port)

    async def cut(self) -> None:
        self._open = False
        await self.stop_listening(wait=True)
        self.drop_connections()

    def admits(self) -> bool:
        return self._open  # accepted just before the cut: it must not get through


def _app(coordinator: Any, target: RedisTarget, base: str, prefix: str, group: str) -> Any:
    app = StreamKit(
        **in_process_settings(coordinator, target, base), redis_release_after=RELEASE_AFTER_S
    )
    app.handled = []  # type: ignore[attr-defined]

    @app.stream_listener(stream_prefix=prefix, group=group, block_ms=200)
    async def handle(msg: Message) -> None:
        # By stream and id: two shards' entries may get the same id (same millisecond).
        app.handled.append((msg.stream_key, msg.id))  # type: ignore[attr-defined]
        await msg.ack()

    return app


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_member_without_redis_gives_shards_to_one_with_redis(
    any_redis: RedisTarget,
    redis_server: RedisServer,
    coordinator: Any,
    redis: Any,
    names: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    prefix, group = names
    admin = Admin(coordinator)
    await admin.create_group(prefix, group, SHARDS)
    forwarder = CuttableForwarder(redis_server.port)
    await forwarder.restore()
    cut = _app(coordinator, RedisTarget(forwarder.url, cluster=False), "cut", prefix, group)
    healthy = _app(coordinator, any_redis, "healthy", prefix, group)
    both = ["cut-m0", "healthy-m0"]
    caplog.set_level(logging.INFO, logger="streamkit.consumer")

    async def publish() -> set[tuple[str, str]]:
        keys = [f"{prefix}:{s}" for s in range(SHARDS)]
        return {(key, (await redis.xadd(key, {"n": key})).decode()) for key in keys}

    try:
        async with serving(cut), serving(healthy):
            await eventually(
                lambda: _settled(admin, prefix, group, both), 20, "both members sharing shards"
            )
            await forwarder.cut()
            # Heartbeats of `cut` still succeed: only its failed reads make it let go.
            await eventually(
                lambda: _settled(admin, prefix, group, ["healthy-m0"]),
                20,
                "the healthy member owning every shard",
            )
            states = {m.member_id: m.state for m in (await admin.members(prefix, group)).members}
            # It left; it was not expired or fenced (its heartbeats never stopped).
            assert states.get("cut-m0") in (None, MemberState.LEAVING), states
            released = [r.getMessage() for r in caplog.records if "giving back" in r.getMessage()]
            assert released, "no release was logged"
            assert "STREAMKIT_REDIS_URL" in released[0], released
            assert f"127.0.0.1:{forwarder.port}/0" in released[0], released

            ids = await publish()
            await eventually(lambda: ids <= set(healthy.handled), 10, "the healthy member handling")

            await forwarder.restore()
            await eventually(
                lambda: _settled(admin, prefix, group, both), 20, "the cut member rejoining"
            )
            assert any("Redis answers again" in r.getMessage() for r in caplog.records)
            ids = await publish()
            await eventually(
                lambda: ids <= set(healthy.handled) | set(cut.handled), 10, "both handling"
            )
            assert ids & set(cut.handled), "the rejoined member handles its shards again"
    finally:
        await forwarder.cut()


async def _settled(admin: Admin, prefix: str, group: str, members: list[str]) -> bool:
    # 503 REDIS_UNAVAILABLE while the coordinator's Redis is restarting.
    probe = await admin.get(f"/monitoring/streams/{prefix}/groups/{group}/assignments")
    if probe.status_code == 503:
        return False
    return settled_ownership(await admin.owners(prefix, group), members, SHARDS)


async def test_app_rides_out_a_redis_restart(
    coordinator_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # appendfsync always: the coordinator's groups survive the SIGKILL below.
    with RedisServer(extra_args=("--appendonly", "yes", "--appendfsync", "always")) as server:
        target = RedisTarget(server.url, cluster=False)
        # Heartbeats every second (assignment lease 2 s): a read is in flight
        # when Redis dies, so its failure starts the 0.5 s release clock well
        # before the lease runs out.  With the 200 ms default (a 400 ms lease)
        # a late heartbeat under load could park every read for lack of lease
        # first; the member then stops reading without noticing Redis is gone
        # (safe, but not the path this test follows).
        coordinator = coordinator_factory(
            target, heartbeat_interval_ms=1_000, member_lease_ttl_ms=5_000
        )
        admin = Admin(coordinator)
        prefix, group = f"restart-{uuid.uuid4().hex[:8]}", "billing"
        await admin.create_group(prefix, group, SHARDS)
        app = _app(coordinator, target, "restart", prefix, group)
        client = redis_client(target)
        caplog.set_level(logging.INFO, logger="streamkit.consumer")
        try:
            async with serving(app):
                await eventually(
                    lambda: _settled(admin, prefix, group, ["restart-m0"]), 20, "joining"
                )
                first = (f"{prefix}:0", (await client.xadd(f"{prefix}:0", {"n": "1"})).decode())
                await eventually(lambda: first in app.handled, 10, "the first message")

                server.kill()
                await eventually(
                    lambda: any("giving back shards" in r.getMessage() for r in caplog.records),
                    20,
                    "the member giving its shards back",
                )
                member = app.members[0]
                await eventually(lambda: member.machine.epoch == 0, 20, "the member leaving")
                server.restart()

                await eventually(
                    lambda: _settled(admin, prefix, group, ["restart-m0"]), 30, "rejoining"
                )
                # A new client: the old one's pooled connection died with the server.
                await client.aclose()
                client = redis_client(target)
                second = (f"{prefix}:1", (await client.xadd(f"{prefix}:1", {"n": "2"})).decode())
                await eventually(lambda: second in app.handled, 10, "a message after the restart")
        finally:
            await client.aclose()
