"""The app object: fail-fast start-up, DI wiring, publishers, lifespan hooks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from dependency_injector import containers, providers
from dependency_injector.wiring import Provide, inject

from streamkit import GroupNotFoundError, Message, Publisher, StreamKit
from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import TEST_TOKEN_SECRET, CoordinatorProcess
from streamkit_server.auth.security import Authenticator, Principal, Role

from .support import Admin, InProcessApp, eventually, in_process_settings, serving

pytestmark = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)


async def handler(msg: Message) -> None:
    await msg.ack()


@pytest.mark.parametrize("credentials", [True, False], ids=["get_group", "first_heartbeat"])
async def test_unknown_group_fails_at_start(
    coordinator: CoordinatorProcess, any_redis: RedisTarget, credentials: bool
) -> None:
    settings = in_process_settings(coordinator, any_redis, "lost")
    if not credentials:  # MEMBER but no READ: the first heartbeat's 404 is fatal instead
        del settings["coordinator_username"], settings["coordinator_password"]
        settings["coordinator_token"] = _member_only_token()
    app = StreamKit(**settings)
    app.add_listener("nowhere", "nobody", handler, concurrency=2)
    with (
        anyio.fail_after(5),
        pytest.raises(GroupNotFoundError, match="'nobody' on stream 'nowhere'"),
    ):
        await app.serve()


def _member_only_token() -> str:
    signer = Authenticator("admin", "unused", TEST_TOKEN_SECRET.encode(), 3600)
    token, _ = signer.issue(Principal("consumer", frozenset({Role.MEMBER}), "bearer"))
    return token


class Services(containers.DeclarativeContainer):
    greeting = providers.Object("hello")
    invoices = providers.Dependency(instance_of=Publisher)


seen: list[tuple[str, str]] = []


@inject
async def bill(
    msg: Message,
    greeting: str = Provide[Services.greeting],
    invoices: Publisher = Provide[Services.invoices],
) -> None:
    seen.append((greeting, msg.fields["order"]))
    await invoices.publish(msg.fields["order"], {"invoice": msg.fields["order"]})
    await msg.ack()


async def test_handlers_get_dependencies_and_publishers(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    await admin.create_group(f"{prefix}-invoices", "archive", 2)
    events: list[str] = []

    @asynccontextmanager
    async def lifespan(app: StreamKit) -> AsyncIterator[None]:
        events.append("lifespan-enter")
        yield
        events.append("lifespan-exit")

    app = make_app("di", container=Services(), lifespan=lifespan)
    out = app.publisher(stream_prefix=f"{prefix}-invoices", group="archive", provide_as="invoices")
    assert out.stream_prefix == f"{prefix}-invoices"
    app.on_startup(lambda: events.append("startup"))

    @app.on_shutdown
    async def goodbye() -> None:
        events.append("shutdown")

    app.add_listener(prefix, group, bill)
    for i in range(10):
        await redis.xadd(f"{prefix}:{i % 2}", {"order": f"o-{i}"})
    seen.clear()
    with anyio.fail_after(20):
        async with serving(app):
            await eventually(lambda: len(seen) == 10, 10, "10 orders billed")
    assert {greeting for greeting, _ in seen} == {"hello"}
    invoices = [
        fields[b"invoice"].decode()
        for shard in range(2)
        for _, fields in await redis.xrange(f"{prefix}-invoices:{shard}")
    ]
    assert sorted(invoices) == sorted(f"o-{i}" for i in range(10))
    assert events == ["lifespan-enter", "startup", "shutdown", "lifespan-exit"]


async def test_async_with_releases_connections(
    admin: Admin, names: tuple[str, str], make_app: InProcessApp
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    async with make_app("ctx") as app:
        publisher = app.publisher(stream_prefix=prefix, group=group)
        result = await publisher.publish("k", {"v": "1"})
        assert result.stream_key == f"{prefix}:0"
        assert await app.redis.ping()
    # Owned clients are closed and forgotten: a new one would be made on demand.
    assert app._redis is None and app._coordinator is None
