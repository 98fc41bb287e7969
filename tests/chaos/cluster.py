"""The soak on a Redis Cluster: three primaries with a replica each, every
client (publisher, consumers, coordinators) in cluster mode.

Clients bootstrap through ``front`` (a proxy over every node, so a start-up
node is always found alive); after that they talk to the nodes the cluster
announces, and must follow failovers and slot moves by themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

import redis.asyncio
from redis.asyncio.cluster import ClusterNode

from streamkit.testing import HOST, RedisCluster, RedisServer

from .topology import Topology

#: Short, so a failover (node-timeout + election) fits many times in a run.
NODE_TIMEOUT_MS = 1_500
_ARGS = ("--enable-debug-command", "yes", "--repl-diskless-sync-delay", "0")


class ClusterTopology(Topology):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cluster = True
        self.redis_cluster = RedisCluster(
            primaries=3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS, extra_args=_ARGS
        )
        env = {"STREAMKIT_REDIS_CLUSTER": "true"}
        self.consumer_env.update(env)
        self.publisher_env.update(env)

    async def start_redis(self) -> None:
        await self.front.start()
        await self.lb.start()
        await asyncio.to_thread(self.redis_cluster.start)
        self.front.switch([n.port for n in self.redis_cluster.nodes], cut=False)

    def client(self, exclude: Collection[int] = ()) -> redis.asyncio.RedisCluster:
        """The chaos' own cluster client, bootstrapping from every running node
        but those in ``exclude`` (paused: a connection to one would hang)."""
        nodes = [
            ClusterNode(HOST, n.port)
            for n in self.redis_cluster.nodes
            if n.is_running() and n.port not in exclude
        ]
        return redis.asyncio.RedisCluster(
            startup_nodes=nodes, socket_timeout=10, socket_connect_timeout=2
        )

    def node_by_port(self, port: int) -> RedisServer:
        return next(n for n in self.redis_cluster.nodes if n.port == port)

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self.redis_cluster.stop)
