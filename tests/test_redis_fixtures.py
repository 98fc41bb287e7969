"""Prove the Redis fixtures are real servers that behave like production Redis."""

from __future__ import annotations

import time

import pytest
import redis
import redis.asyncio
from redis.asyncio.cluster import ClusterNode
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamkit.testing import CLUSTER_SLOTS, RedisCluster, RedisServer, RedisTarget, redis_client


async def test_standalone_stream_round_trip(redis_url: str) -> None:
    client = redis_client(RedisTarget(redis_url, cluster=False), decode_responses=True)
    try:
        # The fixture flushed the server, so nothing from other tests leaks in.
        assert await client.dbsize() == 0
        await client.xgroup_create("orders:0", "billing", id="0", mkstream=True)
        sent = await client.xadd("orders:0", {"order": "123", "amount": "9.99"})

        batches = await client.xreadgroup("billing", "c1", {"orders:0": ">"}, count=10)

        assert batches == [["orders:0", [(sent, {"order": "123", "amount": "9.99"})]]]
        assert await client.xack("orders:0", "billing", sent) == 1
        pending = await client.xpending("orders:0", "billing")
        assert pending["pending"] == 0
    finally:
        await client.aclose()


async def test_cluster_is_up_with_three_primaries(redis_cluster: RedisCluster) -> None:
    for node in redis_cluster.nodes:
        info = redis_cluster.cluster_info(node)
        assert info["cluster_state"] == "ok"
        assert info["cluster_slots_assigned"] == str(CLUSTER_SLOTS)

    client = redis.asyncio.RedisCluster.from_url(redis_cluster.url)
    try:
        await client.initialize()
        primaries = client.get_primaries()
        assert len(primaries) == 3
        assert {int(n.port) for n in primaries} == {port for _, port in redis_cluster.startup_nodes}
        assert client.get_replicas() == []
    finally:
        await client.aclose()


async def test_shard_streams_spread_over_cluster_nodes(
    cluster_url: str, redis_cluster: RedisCluster
) -> None:
    keys = [f"orders:{i}" for i in range(16)]
    client = redis_client(RedisTarget(cluster_url, cluster=True), decode_responses=True)
    assert isinstance(client, redis.asyncio.RedisCluster)
    try:
        owners: dict[str, int] = {}
        for key in keys:
            await client.xadd(key, {"k": key})
            slot = await client.cluster_keyslot(key)
            node = client.get_node_from_key(key)
            assert isinstance(node, ClusterNode)
            # The client's slot map and the server's hash must agree.
            assert client.keyslot(key) == slot
            owners[key] = int(node.port)
    finally:
        await client.aclose()

    assert len(set(owners.values())) > 1, owners

    # Ask each node directly which keys it really stores: the data is
    # physically sharded, not merely routed differently by the client.
    stored: dict[int, set[str]] = {}
    for server in redis_cluster.nodes:
        with server.client(decode_responses=True) as conn:
            stored[server.port] = set(conn.scan_iter(match="orders:*"))
    assert sorted(k for ks in stored.values() for k in ks) == sorted(keys)
    for key, port in owners.items():
        assert key in stored[port]
    assert sum(1 for ks in stored.values() if ks) > 1


async def test_any_redis_round_trip(any_redis: RedisTarget) -> None:
    client = redis_client(any_redis, decode_responses=True)
    try:
        await client.set(f"probe:{any_redis.kind}", "1")
        assert await client.get(f"probe:{any_redis.kind}") == "1"
        assert isinstance(client, redis.asyncio.RedisCluster) is any_redis.cluster
    finally:
        await client.aclose()


def test_kill_and_restart_private_server(private_redis_server: RedisServer) -> None:
    server = private_redis_server
    url, old_pid = server.url, server.pid
    with server.client() as conn:
        conn.set("before-crash", "1")

    server.kill()
    assert not server.is_running()
    with (
        server.client(retry=Retry(NoBackoff(), 0)) as conn,
        pytest.raises(redis.ConnectionError),
    ):
        conn.ping()

    server.restart()
    assert server.is_running()
    assert server.url == url
    assert server.pid != old_pid
    with server.client() as conn:
        assert conn.ping()
        # save "" and no AOF: a crash loses everything, as the fixture promises.
        assert conn.get("before-crash") is None


def test_stop_removes_process_and_directory() -> None:
    server = RedisServer().start()
    directory = server.dir
    assert directory is not None and directory.is_dir()
    server.stop()
    assert not server.is_running()
    assert server.pid is None
    assert not directory.exists()
    server.stop()  # idempotent


def test_cluster_with_a_replica_per_primary_fails_over() -> None:
    """``replicas=1``: six nodes, three of them replicas; a replica that takes
    over (``CLUSTER FAILOVER``) becomes a primary and ``flushall`` follows it."""
    with RedisCluster(primaries=3, replicas=1, node_timeout_ms=1000) as cluster:
        assert len(cluster.nodes) == 6
        primaries = cluster.current_primaries()
        assert len(primaries) == 3
        replica = next(n for n in cluster.nodes if n not in primaries)
        assert cluster.role(replica) == "slave"
        with replica.client() as conn:
            conn.execute_command("CLUSTER", "FAILOVER")
        # The old primary learns it was demoted a moment after the replica
        # took over: wait for both.
        for _ in range(200):
            if cluster.role(replica) == "master" and len(cluster.current_primaries()) == 3:
                break
            time.sleep(0.05)
        assert replica in cluster.current_primaries()
        assert len(cluster.current_primaries()) == 3
        cluster.flushall()  # a replica would answer READONLY


def test_a_server_handed_a_taken_port_does_not_take_the_other_for_its_own(
    private_redis_server: RedisServer,
) -> None:
    """A second server started on the port of a running one must fail (with a
    fixed port) instead of taking the first one's PING as its own: two nodes
    of one test cluster were once handed one port and the cluster never
    converged."""
    from streamkit.testing.redis_server import RedisServerError

    twin = RedisServer(private_redis_server.port, startup_timeout=5.0)
    with pytest.raises(RedisServerError, match="already in use"):
        twin.start()
    assert not twin.is_running() and private_redis_server.is_running()


def test_cluster_nodes_get_distinct_ports_and_bus_ports() -> None:
    from streamkit.testing.process import CLUSTER_BUS_PORT_OFFSET

    for _ in range(20):  # construction starts nothing
        cluster = RedisCluster(3, replicas=1)
        ports = [node.port for node in cluster.nodes]
        every = ports + [port + CLUSTER_BUS_PORT_OFFSET for port in ports]
        assert len(set(every)) == len(every)
