"""Taking a group mutex in Redis, with a bounded wait.

The mutex is a key with a random owner token and a TTL (a crashed holder
cannot block a group for longer than the TTL); it is released only by its
owner (compare-and-delete, in the commit script or ``MetadataStore.release``).
Acquiring it and loading the group are one Lua script, so the common case
costs one round trip.
"""

from __future__ import annotations

import random
import time

import anyio

from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.metadata import MetadataStore
from streamkit_server.store.records import Loaded, MutexBusy

__all__ = ["MutexTimeout", "lock_and_load"]

_FIRST_BACKOFF_S = 0.002
_MAX_BACKOFF_S = 0.05


class MutexTimeout(Exception):
    """The group mutex stayed taken for the whole wait budget."""


async def lock_and_load(
    store: MetadataStore, keys: GroupKeys, token: str, ttl_ms: int, wait_ms: int
) -> Loaded | None:
    """Take the mutex of ``keys`` and load the group.

    Returns the group (mutex held by ``token``) or ``None`` when the metadata
    key does not exist (mutex already given back).  Raises ``MutexTimeout``.
    """
    started = time.monotonic()
    deadline = started + wait_ms / 1000
    backoff = _FIRST_BACKOFF_S
    while True:
        try:
            result = await store.load(keys, token, ttl_ms)
        except MutexBusy:
            pass
        else:
            store.metrics.mutex_wait_seconds.observe(time.monotonic() - started)
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            store.metrics.mutex_timeouts.inc()
            raise MutexTimeout(f"group mutex {keys.mutex} stayed taken for {wait_ms} ms")
        # Jitter keeps processes that collided from colliding again in step.
        await anyio.sleep(min(remaining, backoff * (0.5 + random.random())))
        backoff = min(backoff * 2, _MAX_BACKOFF_S)
