"""Fixtures of the consumer tests: a real coordinator, real Redis, real processes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamkit import StreamKit
from streamkit.testing import RedisTarget, redis_client
from streamkit.testing.coordinator import CoordinatorProcess

from .support import Admin, AppProcess, InProcessApp, app_env, in_process_settings


@pytest.fixture
def names() -> tuple[str, str]:
    """A fresh stream prefix and group per test."""
    tag = uuid.uuid4().hex[:8]
    return f"orders-{tag}", "billing"


@pytest.fixture
def admin(coordinator: CoordinatorProcess) -> Admin:
    return Admin(coordinator)


@pytest.fixture
async def redis(any_redis: RedisTarget) -> AsyncIterator[Any]:
    client = redis_client(any_redis)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def make_app(coordinator: CoordinatorProcess, any_redis: RedisTarget) -> InProcessApp:
    """``make_app(base, **options)``: a ``StreamKit`` app inside the test process,
    on this test's coordinator and Redis; ``base`` names its members."""

    def make(base: str, **options: Any) -> StreamKit:
        return StreamKit(**in_process_settings(coordinator, any_redis, base), **options)

    return make


AppFactory = Callable[..., AppProcess]


@pytest.fixture
def app_process(
    tmp_path: Path, coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> Iterator[AppFactory]:
    """Start ``streamkit run`` processes of ``tests.consumer.apps.*``; all are
    killed (by pid) at teardown."""
    started: list[AppProcess] = []

    def make(
        base: str,
        prefix: str,
        group: str,
        *,
        module: str = "recording",
        coordinator_process: CoordinatorProcess | None = None,
        args: tuple[str, ...] = (),
        settings: dict[str, str] | None = None,
        **extra: object,
    ) -> AppProcess:
        record = tmp_path / f"{base}-{len(started)}.rec"
        env = app_env(
            coordinator_process or coordinator,
            any_redis,
            base=base,
            prefix=prefix,
            group=group,
            record=record,
            **extra,
        )
        env.update(settings or {})  # STREAMKIT_* overrides
        proc = AppProcess(
            f"tests.consumer.apps.{module}:app",
            env,
            tmp_path / f"{base}-{len(started)}.log",
            args=args,
        )
        proc.record = record  # type: ignore[attr-defined]
        started.append(proc)
        return proc.start()

    try:
        yield make
    finally:
        for proc in started:
            proc.cleanup()
