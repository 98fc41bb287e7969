"""Per-principal token versions in Redis: revoking a principal's tokens everywhere.

Every token carries the version its principal had when it was issued; a
request with a bearer token is accepted only while that still equals the
version in Redis.  ``revoke`` bumps it (admin endpoint and CLI), so every
coordinator process sharing the Redis refuses the older tokens at once,
without a revocation list that grows.

Reading the version on every request would cost a Redis round trip per
heartbeat, as much again as the heartbeat's own write.  So each process keeps
the versions it read in a :class:`VersionCache`, and Redis keeps that cache
honest: a dedicated connection turns on ``CLIENT TRACKING`` for the hash
(broadcast mode, RESP3), and Redis pushes an invalidation on it whenever the
hash changes, queued before the reply to the revoke that changed it.  The
cache is trusted only while that connection proves alive (a ``PING`` every
half second; see ``VersionCache.confirmed``), and an entry is read again from
Redis after ``MAX_AGE_MS`` in any case.  Without tracking (a Redis that
refuses it) every request reads Redis, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client import Counter
from redis.asyncio import RedisCluster
from redis.exceptions import RedisError, ResponseError

from streamkit.backoff import jittered_backoff
from streamkit_server.store.keys import token_versions_key
from streamkit_server.store.records import RedisClient

__all__ = [
    "TokenVersions",
    "VersionCache",
    "current_version",
    "revoke",
    "token_versions_key",
]

log = logging.getLogger("streamkit_server.token_versions")

#: How often the watch connection is pinged; a ``PONG`` proves every
#: invalidation Redis sent before it has been read.
PING_INTERVAL_MS: Final = 500
#: How long one ``PONG`` keeps the cache trusted: a connection that dies
#: without a reset (no FIN, no RST) can hide invalidations for at most this long.
LIVENESS_MS: Final = 3 * PING_INTERVAL_MS
#: An entry is read from Redis again after this long even while trusted
#: (a Redis Cluster slot that moved away from the watched node, say).
MAX_AGE_MS: Final = 5_000
#: The watch's reconnect delay (jittered, doubling): first and most after a
#: lost connection; after a refusal (an ACL) it tries again this rarely.
_RETRY_S: Final = (0.5, 5.0)
_REFUSED_RETRY_S: Final = 60.0


async def current_version(client: RedisClient, key_prefix: str, username: str) -> int:
    raw = await client.hget(token_versions_key(key_prefix), username)
    return int(raw) if raw is not None else 0


async def revoke(client: RedisClient, key_prefix: str, username: str) -> int:
    """Bump ``username``'s version; returns the new one."""
    return int(await client.hincrby(token_versions_key(key_prefix), username, 1))


@dataclass
class VersionCache:
    """Token versions read from Redis, usable while an invalidation watch is proven alive.

    Sans-IO: the watch and the readers report what happened, with ``now_ms``
    from a monotonic clock.  What it guarantees: ``lookup`` answers a version
    other than Redis's current one only while the invalidation of the change
    is still on its way (sent, not yet ``invalidate``\\ d), or for at most
    ``liveness_ms`` after the watch's last proof of life.
    """

    liveness_ms: int = LIVENESS_MS
    max_age_ms: int = MAX_AGE_MS
    _entries: dict[str, tuple[int, int]] = field(default_factory=dict)  # version, read at
    _generation: int = 0
    _trusted_until_ms: int | None = None

    def lookup(self, username: str, now_ms: int) -> int | None:
        """The cached version, or None: read Redis (and ``remember`` it)."""
        if not self.trusted(now_ms):
            return None
        entry = self._entries.get(username)
        if entry is None or now_ms - entry[1] >= self.max_age_ms:
            return None
        return entry[0]

    def trusted(self, now_ms: int) -> bool:
        return self._trusted_until_ms is not None and now_ms < self._trusted_until_ms

    def reading(self) -> int:
        """Call before sending a read; hand the token to ``remember``."""
        return self._generation

    def remember(self, username: str, version: int, token: int, now_ms: int) -> None:
        # An invalidation that arrived while the read was out may be for a
        # change the read did not see: keep nothing read across it.
        if token == self._generation and self.trusted(now_ms):
            self._entries[username] = (version, now_ms)

    def invalidate(self) -> None:
        """The hash changed (a push from Redis, or a revoke by this process)."""
        self._generation += 1
        self._entries.clear()

    def confirmed(self, pinged_at_ms: int) -> None:
        """A ``PONG`` came back for a ``PING`` sent at ``pinged_at_ms``.

        Redis answers in order on one connection, so every invalidation it
        queued before that ``PING`` has been read by now: the cache is right
        as of the moment the ``PING`` was sent, and stays trusted for
        ``liveness_ms`` from then.
        """
        until = pinged_at_ms + self.liveness_ms
        if self._trusted_until_ms is None:
            # The first proof of a new watch: a read that went out before it
            # may have run before tracking began, and missed a change.
            self.invalidate()
            self._trusted_until_ms = until
        elif until > self._trusted_until_ms:
            self._trusted_until_ms = until

    def lost(self) -> None:
        """The watch connection is gone: nothing cached can be trusted any more."""
        self._trusted_until_ms = None
        self.invalidate()


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class TokenVersions:
    """The versions of one process: cached reads, revokes and the invalidation watch."""

    def __init__(self, client: RedisClient, key_prefix: str, reads: Counter | None = None) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self.key = token_versions_key(key_prefix)
        self.cache = VersionCache()
        # ``reads``: counted by source, ``cache`` or ``redis`` (its one label).
        self._from_cache = reads.labels("cache") if reads is not None else None
        self._from_redis = reads.labels("redis") if reads is not None else None
        self._refused_logged = False

    async def current(self, username: str) -> int:
        cached = self.cache.lookup(username, _now_ms())
        if cached is not None:
            if self._from_cache is not None:
                self._from_cache.inc()
            return cached
        token = self.cache.reading()
        version = await current_version(self.client, self.key_prefix, username)
        self.cache.remember(username, version, token, _now_ms())
        if self._from_redis is not None:
            self._from_redis.inc()
        return version

    async def revoke(self, username: str) -> int:
        version = await revoke(self.client, self.key_prefix, username)
        # This process refuses the old tokens from its next request on, without
        # waiting for its own push.
        self.cache.invalidate()
        return version

    async def watch(self) -> None:
        """Keep an invalidation watch open (runs until cancelled)."""
        failures = 0
        while True:
            refused = False
            try:
                await self._watch_once()
            except ResponseError as exc:  # refused (an ACL, a Redis without RESP3)
                refused = True
                if not self._refused_logged:
                    self._refused_logged = True
                    log.warning(
                        "Redis refused to track token versions (%s): every bearer request"
                        " reads its token version from Redis",
                        exc,
                    )
            except (RedisError, OSError, TimeoutError) as exc:
                log.debug("token-version watch lost: %s", exc)
            except Exception:  # a bug here must not end the watch for good
                log.exception("token-version watch failed")
            finally:
                proven = self.cache.trusted(_now_ms())
                self.cache.lost()
            # A watch that worked for a while: a new one may well work at once.
            failures = 1 if proven else failures + 1
            delay = jittered_backoff(failures, *_RETRY_S, random.random())
            await asyncio.sleep(_REFUSED_RETRY_S if refused else delay)

    async def _watch_once(self) -> None:
        conn = await self._connection()
        try:
            await conn.connect()
            await conn.send_command("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", self.key)
            reply = await conn.read_response(push_request=True)
            if isinstance(reply, ResponseError):
                raise reply
            pinged: deque[int] = deque()
            # Two tasks on one connection: writes and reads do not share a buffer.
            # The first to fail (a dead link, no PONG in time) ends both.
            tasks = {
                asyncio.create_task(self._ping(conn, pinged)),
                asyncio.create_task(self._read(conn, pinged)),
            }
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            for task in done:
                task.result()  # raises what ended it
        finally:
            with contextlib.suppress(Exception):
                await conn.disconnect()

    async def _read(self, conn: Any, pinged: deque[int]) -> None:
        while True:
            reply = await conn.read_response(push_request=True, timeout=math.inf)
            if isinstance(reply, ResponseError):
                raise reply
            if reply == b"PONG" and pinged:
                self.cache.confirmed(pinged.popleft())
            else:
                # An invalidation push (redis-py hands it over as None, without
                # its keys): the one hash is the only key tracked, so drop all.
                self.cache.invalidate()

    async def _ping(self, conn: Any, pinged: deque[int]) -> None:
        while True:
            if pinged and _now_ms() - pinged[0] > self.cache.liveness_ms:
                raise TimeoutError("the token-version watch stopped answering PING")
            pinged.append(_now_ms())
            await conn.send_command("PING")
            await asyncio.sleep(PING_INTERVAL_MS / 1000)

    async def _connection(self) -> Any:
        """A new RESP3 connection (push messages) to the node that holds the hash."""
        client = self.client
        if isinstance(client, RedisCluster):
            await client.initialize()  # the slot map (a no-op once known)
            node = client.get_node_from_key(self.key)
            if node is None:
                raise TimeoutError("no Redis Cluster node known for the token-version hash")
            return node.connection_class(**{**node.connection_kwargs, "protocol": 3})
        pool = client.connection_pool
        return pool.connection_class(**{**pool.connection_kwargs, "protocol": 3})
