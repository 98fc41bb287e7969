"""Reading many groups of one stream in one round trip.

A stream-wide change (create a group, scale, roll back) reads every other group
of the stream.  One load after another cost a create on a stream of 1,000
groups over a second (issue 36, docs/performance.md); on a single Redis the
loads now go as one pipeline (in chunks), each read exactly as
``MetadataStore.load`` reads it (same script, same parse cache).  A key whose
pipelined reply cannot be used as is (an error, a parse cache that turned
out stale, metadata that does not parse) is read again with ``load``, which
does the accounting and raises as usual.  Redis Cluster clients read them
with ``load``, a bounded number at a time (a pipeline there spans nodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import anyio
from redis.asyncio import RedisCluster

from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.metadata import WRITE_LOG_SIZE, MetadataStore, _known
from streamkit_server.store.records import Loaded

__all__ = ["load_many"]

_CHUNK: Final = 500
_PARALLEL: Final = 32


async def load_many(store: MetadataStore, keys: Sequence[GroupKeys]) -> list[Loaded | None]:
    """The groups of ``keys`` in order (None where the metadata does not exist)."""
    if isinstance(store.client, RedisCluster):
        return await _parallel(store, keys)
    out: list[Loaded | None] = []
    for start in range(0, len(keys), _CHUNK):
        out += await _pipelined(store, keys[start : start + _CHUNK])
    return out


async def _pipelined(store: MetadataStore, keys: Sequence[GroupKeys]) -> list[Loaded | None]:
    pipe = store.client.pipeline(transaction=False)
    cached = [store._parsed.get(k.metadata) for k in keys]
    for k, c in zip(keys, cached, strict=True):
        args: list[Any] = ["", 0, *_known(c), WRITE_LOG_SIZE]
        # A pipeline queues the call: redis-py types scripts for clients only.
        await store._load(keys=[k.mutex, k.metadata], args=args, client=pipe)  # type: ignore[arg-type]
    replies = await pipe.execute(raise_on_error=False)
    out: list[Loaded | None] = []
    for k, c, reply in zip(keys, cached, replies, strict=True):
        try:
            if isinstance(reply, BaseException):
                raise reply
            out.append(store._loaded(k, c, reply))
        except Exception:
            # Read alone: the usual retry, accounting and error of ``load``.
            store._parsed.pop(k.metadata, None)
            out.append(await store.load(k))
    return out


async def _parallel(store: MetadataStore, keys: Sequence[GroupKeys]) -> list[Loaded | None]:
    out: list[Loaded | None] = [None] * len(keys)
    errors: list[Exception] = []
    limiter = anyio.Semaphore(_PARALLEL)

    async def one(i: int) -> None:
        try:
            async with limiter:
                out[i] = await store.load(keys[i])
        except Exception as exc:  # raised as itself below, not as an ExceptionGroup
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for i in range(len(keys)):
            tg.start_soon(one, i)
    if errors:
        raise errors[0]
    return out
