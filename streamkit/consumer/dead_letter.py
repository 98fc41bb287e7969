"""Reading and replaying a dead-letter stream (``streamkit dlq list|replay``).

A dead letter is the original entry's fields plus ``x-*`` metadata (see
``streamkit.consumer.failure``).  Replaying publishes the original fields again:

* with a partition key (``key_field``: an entry field, or ``payload_key``: a
  top-level key of the JSON ``payload`` field) through a ``Publisher``, so the
  key is routed with the *current* shard count, as any new message would be;
* without one, straight back to its original shard stream (``XADD NOMKSTREAM``),
  which keeps it next to the other entries of its key as long as the stream was
  not resharded since; a retired shard stream makes the replay of that entry
  fail instead of recreating the stream.

The dead letter is deleted (``XDEL``) only after its replay was written, so a
crash in between replays it twice rather than losing it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from streamkit.connections import AsyncRedis
from streamkit.consumer.failure import (
    X_ATTEMPTS,
    X_ERROR,
    X_FAILED_AT,
    X_GROUP,
    X_ORIGINAL_ID,
    X_ORIGINAL_STREAM,
    is_metadata,
)
from streamkit.numerals import ascii_uint
from streamkit.publisher.encoding import PAYLOAD_FIELD
from streamkit.results import PublishResult

__all__ = ["DeadLetter", "ReplayOutcome", "read_dead_letters", "replay"]

#: ``publish(partition_key, fields)``
Publish = Callable[[str, dict[bytes, bytes]], Awaitable[PublishResult]]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: str
    fields: dict[bytes, bytes]

    def meta(self, name: str) -> str:
        return self.fields.get(name.encode(), b"").decode(errors="replace")

    @property
    def original(self) -> dict[bytes, bytes]:
        """The entry as it was published (without the ``x-*`` metadata)."""
        return {k: v for k, v in self.fields.items() if not is_metadata(k.decode(errors="replace"))}

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "originalStream": self.meta(X_ORIGINAL_STREAM),
            "originalId": self.meta(X_ORIGINAL_ID),
            "group": self.meta(X_GROUP),
            "attempts": _int(self.meta(X_ATTEMPTS)),
            "error": self.meta(X_ERROR),
            "failedAt": _int(self.meta(X_FAILED_AT)),
            "fields": {
                k.decode(errors="replace"): v.decode(errors="replace")
                for k, v in self.original.items()
            },
        }


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    letter: DeadLetter
    #: Where it went (``stream/id``), or None when it could not be replayed.
    to: str | None
    error: str | None = None


async def read_dead_letters(
    redis: AsyncRedis,
    key: str,
    *,
    count: int,
    ids: Iterable[str] = (),
    after: str | None = None,
) -> list[DeadLetter]:
    """The oldest ``count`` dead letters (after the id ``after``), or those with ``ids``."""
    wanted = list(ids)
    replies: list[Any] = []
    if wanted:
        for entry_id in wanted:
            replies += await redis.xrange(key, entry_id, entry_id, count=1) or []
    else:
        # "(" makes the start exclusive: a page starts after the last id shown.
        start = "-" if after is None else f"({after}"
        replies = await redis.xrange(key, start, "+", count=count) or []
    return [DeadLetter(_text(i), dict(f)) for i, f in replies if f is not None]


def partition_key(letter: DeadLetter, key_field: str | None, payload_key: str | None) -> str:
    """The letter's partition key, from an entry field or the JSON payload."""
    if key_field is not None:
        value = letter.fields.get(key_field.encode())
        if value is None:
            raise KeyError(f"no field {key_field!r}")
        return value.decode()
    assert payload_key is not None
    raw = letter.fields.get(PAYLOAD_FIELD.encode())
    if raw is None:
        raise KeyError(f"no field {PAYLOAD_FIELD!r}")
    payload = json.loads(raw)
    if not isinstance(payload, dict) or payload_key not in payload:
        raise KeyError(f"the payload has no key {payload_key!r}")
    return str(payload[payload_key])


async def replay(
    redis: AsyncRedis,
    key: str,
    letters: Iterable[DeadLetter],
    *,
    publish: Publish | None = None,
    key_field: str | None = None,
    payload_key: str | None = None,
    delete: bool = True,
) -> list[ReplayOutcome]:
    """Publish each letter's original fields again; delete the letters that were."""
    outcomes = []
    for letter in letters:
        try:
            if publish is not None:
                result = await publish(
                    partition_key(letter, key_field, payload_key), letter.original
                )
                to = f"{result.stream_key}/{result.record_id}"
            else:
                stream = letter.meta(X_ORIGINAL_STREAM)
                args: list[Any] = []
                for name, value in letter.original.items():
                    args += [name, value]
                new_id = await redis.execute_command("XADD", stream, "NOMKSTREAM", "*", *args)
                if new_id is None:
                    raise LookupError(
                        f"{stream} no longer exists (resharded?); replay with --key-field "
                        "or --payload-key to route by partition key"
                    )
                to = f"{stream}/{_text(new_id)}"
        except Exception as exc:
            outcomes.append(ReplayOutcome(letter, None, f"{type(exc).__name__}: {exc}"))
            continue
        if delete:
            await redis.xdel(key, letter.id)
        outcomes.append(ReplayOutcome(letter, to))
    return outcomes


def _int(text: str) -> int:
    # Anyone can XADD to a dead-letter stream: a listing must survive an entry
    # whose metadata is not a number (0: unknown).
    return ascii_uint(text) or 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
