"""Real-Redis helpers shared by the test suite and ``streamkit demo``.

Nothing here fakes Redis: :class:`RedisServer` and :class:`RedisCluster` start
real ``redis-server`` processes on private loopback ports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import redis.asyncio

from streamkit.testing.process import CLUSTER_BUS_PORT_OFFSET, HOST, free_port
from streamkit.testing.redis_cluster import CLUSTER_SLOTS, RedisCluster
from streamkit.testing.redis_server import RedisNotInstalledError, RedisServer, RedisServerError

__all__ = [
    "CLUSTER_BUS_PORT_OFFSET",
    "CLUSTER_SLOTS",
    "HOST",
    "AsyncRedisClient",
    "RedisCluster",
    "RedisNotInstalledError",
    "RedisServer",
    "RedisServerError",
    "RedisTarget",
    "free_port",
    "redis_client",
]

#: Either flavour of redis-py asyncio client; both speak the same command API.
AsyncRedisClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where a test should talk to Redis, and whether that is a cluster."""

    url: str
    cluster: bool

    @property
    def kind(self) -> str:
        return "cluster" if self.cluster else "standalone"


def redis_client(target: RedisTarget, **kwargs: Any) -> AsyncRedisClient:
    """Return a new asyncio client for ``target``; the caller must ``aclose()`` it.

    ``kwargs`` go to ``from_url`` unchanged (e.g. ``decode_responses=True``).
    """
    if target.cluster:
        return redis.asyncio.RedisCluster.from_url(target.url, **kwargs)
    return redis.asyncio.Redis.from_url(target.url, **kwargs)
