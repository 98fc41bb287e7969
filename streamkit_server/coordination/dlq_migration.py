"""Moving dead-letter streams from the old key scheme to the new one, once.

Earlier releases kept a group's dead letters at ``{prefix}:dlq:{group}``.  That
key is also shard ``{group}`` of a stream named ``{prefix}:dlq`` when the group's
name is a number, so listing and replaying dead letters could read, move and
delete another stream's live entries.  Dead letters now live at
``{prefix}/dlq/{group}`` (``/`` never occurs in a valid name).

At start-up the coordinator moves each known group's old dead-letter stream to
the new key.  Entries keep their ids; each batch is copied, then deleted from
the old key, so a crash part-way leaves every entry in at least one place and
the next start finishes the move (an id already present at the new key is not
copied twice).  Works on Redis Cluster: the two keys may live in other slots,
so nothing relies on RENAME.

An old key that is in fact a shard of a registered stream ``{prefix}:dlq`` is
left alone (with a warning): those are live entries, not dead letters.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from redis.exceptions import ResponseError

from streamkit.consumer.failure import dead_letter_key, legacy_dead_letter_key
from streamkit.numerals import ascii_uint
from streamkit_server.store.metadata import MetadataStore
from streamkit_server.store.records import RedisClient

__all__ = ["migrate_dead_letters"]

log = logging.getLogger("streamkit_server.dead_letters")

_BATCH: Final = 500


def _s(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


async def migrate_dead_letters(client: RedisClient, store: MetadataStore) -> int:
    """Move every known group's old dead-letter stream; returns the entries moved."""
    moved = 0
    for prefix, group in await store.indexed_groups():
        old = legacy_dead_letter_key(prefix, group)
        if _s(await client.type(old)) != "stream":
            continue
        if ascii_uint(group) is not None and await store.read_stream_record(f"{prefix}:dlq"):
            log.warning(
                "%s is shard %s of the stream %r, not dead letters of group %r: left alone",
                old, group, f"{prefix}:dlq", group,
            )  # fmt: skip
            continue
        new = dead_letter_key(prefix, group)
        count = await _move(client, old, new)
        if count:
            log.info("moved %d dead letters from %s to %s", count, old, new)
        moved += count
    return moved


async def _move(client: RedisClient, old: str, new: str) -> int:
    moved = 0
    while True:
        batch = await client.xrange(old, "-", "+", count=_BATCH)
        if not batch:
            break
        ids: list[Any] = []
        for raw_id, raw_fields in batch:
            if raw_id is None:  # redis-py types a deleted entry's id so; XRANGE never has one
                continue
            entry_id = _s(raw_id)
            fields: dict[Any, Any] = dict(raw_fields or {})
            try:
                await client.xadd(new, fields, id=entry_id)
            except ResponseError:
                # An id at or below the new stream's last one: either copied
                # before a crash (skip it), or written since under the new key.
                if not await client.xrange(new, entry_id, entry_id, count=1):
                    await client.xadd(new, fields)
            ids.append(raw_id)
            moved += 1
        await client.xdel(old, *ids)
    if not await client.xlen(old):
        await client.delete(old)
    return moved
