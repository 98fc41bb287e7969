"""A consumer group's dead letters, listed and replayed by the coordinator.

Consumers write dead letters (``streamkit.consumer.failure``); the coordinator only
reads the group's default dead-letter stream (``{prefix}/dlq/{group}``) and
replays one entry on an operator's request, with the library's own replay
(``streamkit.consumer.dead_letter``), so the console and ``streamkit dlq replay`` do
the same thing:

* with a partition key (``keyField`` or ``payloadKey``), the entry is routed
  with the group's *current* layout, the way a ``Publisher`` routes it;
* without one, it goes back to its original shard stream, but only while that
  shard is still in the layout: after a reshard the original shard may be
  draining or retired, and writing to it would either break the drain proof or
  put the entry next to keys it no longer belongs with.  Then the operator has
  to name the partition key.

Replay is at least once: the dead letter is deleted after the new entry was
written, so a crash in between leaves it listed (and replayable) again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from streamkit.consumer.dead_letter import DeadLetter, read_dead_letters, replay
from streamkit.consumer.failure import X_ORIGINAL_STREAM, dead_letter_key
from streamkit.numerals import ascii_uint
from streamkit.publisher.publisher import PublishResult
from streamkit.routing import shard_for_key, stream_key
from streamkit_server.coordination.service import CoordinatorService
from streamkit_server.core import GroupMetadata
from streamkit_server.errors import CoordinatorError
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.records import RedisClient

__all__ = [
    "MAX_PAGE",
    "DeadLetterPage",
    "DeadLetters",
    "Replayed",
    "original_shard",
    "routed_stream",
]

#: The longest page a caller may ask for.
MAX_PAGE: Final = 500


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    stream: str
    #: Entries in the dead-letter stream, all pages together.
    total: int
    letters: list[DeadLetter]
    #: Pass as ``cursor`` for the next page; None on the last one.
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Replayed:
    letter: DeadLetter
    stream_key: str
    record_id: str


def routed_stream(group: GroupMetadata, partition_key: str) -> tuple[int, str]:
    """(routing index, stream key) of ``partition_key`` under the group's current layout.

    The same rule a ``Publisher`` applies to the producer-routing answer:
    routing index ``i`` writes to physical shard ``layout[i]``.
    """
    index = shard_for_key(partition_key, len(group.layout))
    return index, stream_key(group.stream_prefix, group.layout[index])


def original_shard(group: GroupMetadata, stream: str) -> int | None:
    """The shard of ``stream`` if it is a shard of the group's current layout, else None."""
    head, _, tail = stream.rpartition(":")
    shard = ascii_uint(tail)
    if head != group.stream_prefix or shard is None:
        return None
    return shard if shard in group.layout else None


class DeadLetters:
    def __init__(self, service: CoordinatorService, client: RedisClient) -> None:
        self.service = service
        self.client = client

    async def page(self, keys: GroupKeys, *, after: str | None, limit: int) -> DeadLetterPage:
        """Up to ``limit`` dead letters, oldest first, after the id ``after``."""
        await self.service.read_group(keys)  # GROUP_NOT_FOUND before anything else
        stream = dead_letter_key(keys.stream_prefix, keys.consumer_group)
        # One more than asked tells whether there is a next page.
        letters = await read_dead_letters(self.client, stream, count=limit + 1, after=after)
        total = int(await self.client.xlen(stream))
        more = len(letters) > limit
        letters = letters[:limit]
        return DeadLetterPage(stream, total, letters, letters[-1].id if more else None)

    async def replay(
        self,
        keys: GroupKeys,
        entry_id: str,
        *,
        key_field: str | None = None,
        payload_key: str | None = None,
    ) -> Replayed:
        """Publish one dead letter again, then delete it from the dead-letter stream."""
        # A mutation: refused once the process is terminating, like the others.
        async with self.service.gate.critical():
            group = await self.service.read_group(keys)
            stream = dead_letter_key(keys.stream_prefix, keys.consumer_group)
            found = await read_dead_letters(self.client, stream, count=1, ids=[entry_id])
            if not found:
                raise CoordinatorError(
                    "DEAD_LETTER_NOT_FOUND", f"no dead letter {entry_id} in {stream}"
                )
            letter = found[0]
            keyed = key_field is not None or payload_key is not None
            if not keyed and original_shard(group, letter.meta(X_ORIGINAL_STREAM)) is None:
                raise CoordinatorError(
                    "REPLAY_NEEDS_PARTITION_KEY",
                    f"the dead letter came from {letter.meta(X_ORIGINAL_STREAM)!r}, which is "
                    f"not a shard of the current layout {group.layout}; replay it with "
                    "keyField or payloadKey so that its partition key is routed again",
                )

            async def publish(partition_key: str, fields: dict[bytes, bytes]) -> PublishResult:
                index, target = routed_stream(group, partition_key)
                args: list[bytes | str] = []
                for name, value in fields.items():
                    args += [name, value]
                # NOMKSTREAM: a stream retired since the layout was read is not recreated.
                new_id = await self.client.execute_command("XADD", target, "NOMKSTREAM", "*", *args)
                if new_id is None:
                    raise LookupError(f"{target} does not exist (resharded meanwhile?); retry")
                record_id = new_id.decode() if isinstance(new_id, bytes) else str(new_id)
                return PublishResult(target, index, record_id, group.metadata_version)

            (outcome,) = await replay(
                self.client,
                stream,
                [letter],
                publish=publish if keyed else None,
                key_field=key_field,
                payload_key=payload_key,
            )
        if outcome.to is None:
            raise CoordinatorError(
                "DEAD_LETTER_NOT_REPLAYED",
                f"dead letter {entry_id} was not replayed: {outcome.error}",
            )
        target, _, record_id = outcome.to.rpartition("/")
        return Replayed(letter, target, record_id)
