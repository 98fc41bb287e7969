"""The token-version cache: never stale beyond an invalidation still on its way.

The model plays Redis and the watch connection: revokes bump a principal's
version and queue an invalidation push on the watch connection, ``PING``\\ s
are answered in order with those pushes, reads run at some point between
being sent and being answered, and the connection can drop (and reconnect)
or black-hole.  After every step, a lookup may answer a version other than
Redis's current one only while a push about a change is still queued, and
never once the last proof of life is older than the liveness window.

The second half runs ``TokenVersions`` against a real redis-server and a
real Redis Cluster: cache hits send no ``HGET``, a revoke by another client
is seen through Redis's push, and a killed watch connection sends every
lookup to Redis until a new watch proves alive.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from prometheus_client import CollectorRegistry, Counter
from redis.asyncio import RedisCluster as ClusterClient

from streamkit.testing import RedisTarget, redis_client
from streamkit_server.auth.token_versions import (
    LIVENESS_MS,
    MAX_AGE_MS,
    TokenVersions,
    VersionCache,
    token_versions_key,
)
from streamkit_server.store.records import RedisClient

USERS = ("alice", "bob")


@dataclass
class Read:
    user: str
    token: int
    value: int | None = None  # set once Redis has run it


@dataclass
class Watch:
    """One watch connection: what Redis has queued on it, in order."""

    queue: deque[tuple[str, int]] = field(default_factory=deque)  # ("push", 0) / ("pong", sent)
    blackholed: bool = False


class CacheModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache = VersionCache()
        self.now = 0
        self.redis = dict.fromkeys(USERS, 0)
        self.watch: Watch | None = Watch()  # None: between a drop and the reconnect
        self.reads: list[Read] = []

    @initialize()
    def proven_watch(self) -> None:
        """Start where a process spends its life: a watch that has answered a PING."""
        assert self.watch is not None
        self.cache.confirmed(self.now)

    # -- Redis --------------------------------------------------------------
    @rule(user=st.sampled_from(USERS))
    def revoke(self, user: str) -> None:
        self.redis[user] += 1
        if self.watch is not None:
            self.watch.queue.append(("push", 0))

    @rule(user=st.sampled_from(USERS))
    def send_read(self, user: str) -> None:
        self.reads.append(Read(user, self.cache.reading()))

    @rule(data=st.data())
    def redis_runs_read(self, data: st.DataObject) -> None:
        waiting = [r for r in self.reads if r.value is None]
        if waiting:
            read = data.draw(st.sampled_from(waiting))
            read.value = self.redis[read.user]

    @rule(data=st.data())
    def read_answered(self, data: st.DataObject) -> None:
        done = [r for r in self.reads if r.value is not None]
        if done:
            read = data.draw(st.sampled_from(done))
            self.reads.remove(read)
            assert read.value is not None
            self.cache.remember(read.user, read.value, read.token, self.now)

    # -- the watch connection ------------------------------------------------
    # One rule with weighted choices: as separate rules, Hypothesis's swarm
    # runs often disable the few that prove the watch alive, and the cache
    # then never holds anything worth checking.
    @rule(
        event=st.sampled_from(
            ["ping"] * 3 + ["deliver_one"] * 2 + ["deliver_all"] * 2
            + ["drop", "reconnect", "reconnect", "blackhole"]
        )
    )  # fmt: skip
    def watch_event(self, event: str) -> None:
        watch = self.watch
        if event == "reconnect":
            if watch is None:
                self.watch = Watch()  # CLIENT TRACKING ON: changes from now on are pushed
        elif watch is None:
            return
        elif event == "ping":
            # A PING sent now; Redis queues its PONG behind the pushes before it.
            watch.queue.append(("pong", self.now))
        elif event == "drop":
            # The watch notices its connection is gone (EOF, error, no PONG in time).
            self.watch = None
            self.cache.lost()
        elif event == "blackhole":
            watch.blackholed = True  # nothing queued is ever read
        elif not watch.blackholed:
            while watch.queue:
                kind, sent = watch.queue.popleft()
                if kind == "push":
                    self.cache.invalidate()
                else:
                    self.cache.confirmed(sent)
                if event == "deliver_one":
                    break

    @rule(ms=st.sampled_from([1, 1, 1, 10, 100, LIVENESS_MS, MAX_AGE_MS]))
    def wait(self, ms: int) -> None:
        self.now += ms

    # -- what a request sees ----------------------------------------------------
    @invariant()
    def stale_only_while_a_push_is_on_its_way(self) -> None:
        queued = self.watch is not None and any(k == "push" for k, _ in self.watch.queue)
        for user in USERS:
            seen = self.cache.lookup(user, self.now)
            if seen is not None and seen != self.redis[user]:
                assert queued, f"{user}: cached {seen}, Redis has {self.redis[user]}"

    @invariant()
    def never_trusted_past_the_last_proof(self) -> None:
        if self.cache.trusted(self.now):
            assert self.watch is not None
            # some PONG delivered on this connection was sent within the window
            assert self.cache._trusted_until_ms is not None
            assert self.now < self.cache._trusted_until_ms <= self.now + LIVENESS_MS


TestCacheModel = CacheModel.TestCase
TestCacheModel.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


def test_a_read_answered_across_an_invalidation_is_not_kept() -> None:
    """Redis ran the read, then a revoke; the push arrives before the read's answer."""
    cache = VersionCache()
    cache.confirmed(0)
    token = cache.reading()
    cache.invalidate()
    cache.remember("alice", 0, token, 1)
    assert cache.lookup("alice", 1) is None


def test_a_read_sent_before_a_new_watch_is_proven_is_not_kept() -> None:
    """Sent while no watch was tracking, run before a revoke that nobody pushed."""
    cache = VersionCache()
    cache.confirmed(0)
    cache.lost()  # the watch connection dropped
    token = cache.reading()  # a read goes out and runs; a revoke follows, no push
    cache.confirmed(10)  # a new watch answers its first PING
    cache.remember("alice", 0, token, 11)
    assert cache.lookup("alice", 11) is None
    # A read sent after that proof is kept.
    cache.remember("alice", 1, cache.reading(), 12)
    assert cache.lookup("alice", 12) == 1


# -- against real Redis --------------------------------------------------------

KEY_PREFIX = "tv-test"


async def _hget_calls(client: RedisClient) -> int:
    """The ``HGET`` commands the node holding the hash has run so far."""
    info = await _on_watched_node(client, "INFO", "commandstats")
    assert isinstance(info, dict)
    stat = info.get("cmdstat_hget")
    return int(stat["calls"]) if isinstance(stat, dict) else 0


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


async def _until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture
async def versions(any_redis: RedisTarget) -> AsyncIterator[tuple[TokenVersions, RedisClient]]:
    client = redis_client(any_redis)
    reads = Counter("reads", "", ["source"], registry=CollectorRegistry())
    versions = TokenVersions(client, KEY_PREFIX, reads)
    watch = asyncio.create_task(versions.watch())
    try:
        await _until(lambda: versions.cache.trusted(_now_ms()))
        yield versions, client
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await client.aclose()


async def test_cached_lookups_send_nothing_and_a_revoke_elsewhere_is_pushed(
    versions: tuple[TokenVersions, RedisClient],
) -> None:
    tokens, client = versions
    assert await tokens.current("alice") == 0
    before = await _hget_calls(client)
    for _ in range(20):
        assert await tokens.current("alice") == 0
    assert await _hget_calls(client) == before  # every lookup came from the cache
    # Another process revokes: Redis pushes the invalidation to this watch,
    # well before an entry's MAX_AGE_MS would have sent the lookup to Redis.
    await client.hincrby(token_versions_key(KEY_PREFIX), "alice", 1)
    started = time.monotonic()
    while await tokens.current("alice") != 1:
        assert time.monotonic() - started < MAX_AGE_MS / 2000, "the push never arrived"
        await asyncio.sleep(0.005)
    # This process's own revoke is seen by its next lookup, push or not.
    assert await tokens.revoke("alice") == 2
    assert await tokens.current("alice") == 2


async def test_a_dropped_watch_sends_lookups_to_redis_until_a_new_one_is_proven(
    versions: tuple[TokenVersions, RedisClient],
) -> None:
    tokens, client = versions
    assert await tokens.current("bob") == 0
    tracking = [c for c in await _clients(client) if "t" in c["flags"]]
    assert len(tracking) == 1, "exactly one tracking connection"
    await _on_watched_node(client, "CLIENT", "KILL", "ID", tracking[0]["id"])
    await _until(lambda: not tokens.cache.trusted(_now_ms()))
    # While no watch is proven, a revoke made meanwhile is read from Redis.
    await client.hincrby(token_versions_key(KEY_PREFIX), "bob", 1)
    before = await _hget_calls(client)
    assert await tokens.current("bob") == 1
    assert await _hget_calls(client) == before + 1
    # The watch reconnects by itself and the cache serves again.
    await _until(lambda: tokens.cache.trusted(_now_ms()))
    assert await tokens.current("bob") == 1
    settled = await _hget_calls(client)
    assert await tokens.current("bob") == 1
    assert await _hget_calls(client) == settled


async def _on_watched_node(client: RedisClient, *command: str) -> object:
    """Run ``command`` on the node that holds the token-version hash."""
    if isinstance(client, ClusterClient):
        node = client.get_node_from_key(token_versions_key(KEY_PREFIX))
        return await client.execute_command(*command, target_nodes=node)
    return await client.execute_command(*command)  # type: ignore[no-untyped-call]


async def _clients(client: RedisClient) -> list[dict[str, str]]:
    raw = await _on_watched_node(client, "CLIENT", "LIST")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in text.splitlines()]
