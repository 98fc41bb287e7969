"""Fixtures of the resharding tests: coordinators with a short producer routing lease."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from coordinator_fixtures import CoordinatorPool
from server.sim import redis_of

from streamkit.testing import AsyncRedisClient, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from .support import COORDINATOR_ENV, Admin


@pytest.fixture(scope="module")
def reshard_pool() -> Iterator[CoordinatorPool]:
    with CoordinatorPool() as pool:
        yield pool


@pytest.fixture
def coord(any_redis: RedisTarget, reshard_pool: CoordinatorPool) -> CoordinatorProcess:
    """A shared coordinator (per module and Redis flavour) with a 1.5 s producer lease."""
    return reshard_pool.get(any_redis, env=COORDINATOR_ENV)


@pytest.fixture
def prefix() -> str:
    return f"rs-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=15) as client:
        yield client


@pytest.fixture
async def r(any_redis: RedisTarget) -> AsyncIterator[AsyncRedisClient]:
    async with redis_of(any_redis) as client:
        yield client


@pytest.fixture
def admin(http: httpx.AsyncClient, coord: CoordinatorProcess) -> Admin:
    return Admin(http, coord)
