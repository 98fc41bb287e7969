"""Redis connections for the data plane (standalone or Redis Cluster)."""

from __future__ import annotations

from typing import Any, TypeAlias

import redis.asyncio

#: Either flavour of redis-py asyncio client; both speak the stream commands we use.
AsyncRedis: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster


def connect_redis(url: str, *, cluster: bool = False, **options: Any) -> AsyncRedis:
    """A lazily connecting client: no I/O happens until the first command.

    With ``cluster=True`` the URL names one startup node; the client discovers
    the rest and routes each shard key to the primary owning its slot.
    """
    if cluster:
        return redis.asyncio.RedisCluster.from_url(url, **options)
    return redis.asyncio.Redis.from_url(url, **options)
