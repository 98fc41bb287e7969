"""Redis connections for the data plane (standalone or Redis Cluster)."""

from __future__ import annotations

from typing import Any, TypeAlias
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio

#: Either flavour of redis-py asyncio client; both speak the stream commands we use.
AsyncRedis: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster


#: Defaults for the data plane: a connection that is black-holed (no RST, no
#: answer) fails a command after this long instead of hanging it forever.
#: The poller additionally abandons any read at the end of its lease.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_SOCKET_TIMEOUT_S = 10.0


def connect_redis(
    url: str,
    *,
    cluster: bool = False,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT_S,
    **options: Any,
) -> AsyncRedis:
    """A lazily connecting client: no I/O happens until the first command.

    With ``cluster=True`` the URL names one startup node; the client discovers
    the rest and routes each shard key to the primary owning its slot.
    ``socket_timeout`` must exceed the longest ``BLOCK`` a reader uses.
    """
    options.setdefault("socket_connect_timeout", connect_timeout)
    options.setdefault("socket_timeout", socket_timeout)
    if cluster:
        return redis.asyncio.RedisCluster.from_url(url, **options)
    return redis.asyncio.Redis.from_url(url, **options)


def redacted_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, fit for a log line."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def redis_address(client: AsyncRedis) -> str:
    """Where ``client`` connects (``host:port/db``, never a password), for messages."""
    if isinstance(client, redis.asyncio.RedisCluster):
        nodes = client.nodes_manager.startup_nodes
        return "cluster " + ", ".join(sorted(nodes)) if nodes else "cluster"
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
