"""Shard stream provisioning and name validation.

Creating a stream or group provisions Redis first and writes coordinator
metadata last: the metadata write is what makes a stream/group exist, so a
create that fails midway leaves only empty shard streams (and consumer
groups) behind, which the retry adopts.  Every step is idempotent.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeAlias

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from streamkit.routing import stream_key
from streamkit_server.errors import CoordinatorError
from streamkit_server.store import scripts
from streamkit_server.store.records import RedisClient

__all__ = [
    "MAX_NAME_LENGTH",
    "Provisioner",
    "unsafe_char",
    "validate_consumer_group",
    "validate_group_names",
    "validate_member_id",
    "validate_stream_prefix",
]

MAX_NAME_LENGTH: Final = 200
# Braces would change the cluster hash tag of our keys; whitespace and control
# characters make keys and logs ambiguous; '/' and '%' cannot travel safely in
# one URL path segment.
_FORBIDDEN = re.compile(r"[\s{}/%\x00-\x1f\x7f]")
# Commands per pipeline: large enough for few round trips, small enough
# that one reply never holds megabytes.
_CHUNK = 512
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_Queue: TypeAlias = Callable[[Any, str], object]


# Unicode's control, format (U+202E turns text around), surrogate and line/
# paragraph separator characters (U+2028): invisible or misleading in a log,
# a terminal or the console.
_UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def unsafe_char(value: str) -> str | None:
    """The first control, format or separator character of ``value``, if any."""
    if value.isascii():  # the common case: only the C0 controls and DEL
        bad = _CONTROL.search(value)
        return bad.group() if bad else None
    for char in value:
        if unicodedata.category(char) in _UNSAFE_CATEGORIES:
            return char
    return None


def _validate_name(value: str, what: str, code: str, extra: str = "") -> str:
    if not 1 <= len(value) <= MAX_NAME_LENGTH:
        raise CoordinatorError(
            code, f"{what} must be 1..{MAX_NAME_LENGTH} characters long, got {len(value)}"
        )
    if value in (".", ".."):
        # A URL path segment of "." or ".." is removed by clients and proxies.
        raise CoordinatorError(code, f"{what} may not be {value!r}")
    found = _FORBIDDEN.search(value) or (extra and _extra_pattern(extra).search(value))
    bad = found.group() if found else unsafe_char(value)
    if bad:
        raise CoordinatorError(
            code,
            f"{what} {value!r} contains {bad!r}; braces, whitespace, control or format "
            f"characters, '/' and '%'{' and ' + repr(extra) if extra else ''} are not allowed",
        )
    return value


@functools.cache
def _extra_pattern(extra: str) -> re.Pattern[str]:
    # Compiled once: names are checked on every heartbeat.
    return re.compile(f"[{re.escape(extra)}]")


def validate_stream_prefix(value: str) -> str:
    return _validate_name(value, "streamPrefix", "INVALID_STREAM_PREFIX")


def validate_consumer_group(value: str) -> str:
    # ':' separates streamPrefix and group inside the metadata hash tag; a
    # group without ':' keeps "{a:b:c}" unambiguous.
    return _validate_name(value, "consumerGroup", "INVALID_CONSUMER_GROUP", extra=":")


@functools.lru_cache(maxsize=4096)
def validate_group_names(stream_prefix: str, consumer_group: str) -> None:
    """Both names of a group (``CoordinatorError`` if one is invalid).

    Every heartbeat checks them, twice (before its rate limit counts, then for
    its keys): valid pairs are remembered, a few thousand at most, so a fleet's
    heartbeats pay a dictionary lookup.  A refusal is never remembered.
    """
    validate_stream_prefix(stream_prefix)
    validate_consumer_group(consumer_group)


def validate_member_id(value: str) -> str:
    if not 1 <= len(value) <= 256 or unsafe_char(value) is not None:
        raise CoordinatorError(
            "INVALID_MEMBER_ID",
            "memberId must be 1..256 characters without control, format or line "
            "separator characters",
        )
    return value


class Provisioner:
    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self._script: AsyncScript = client.register_script(scripts.PROVISION)

    async def collisions(self, stream_prefix: str, shards: Sequence[int]) -> list[str]:
        """Shard keys that hold data we did not create (a non-empty stream or another type).

        An existing *empty* stream is what an interrupted create leaves behind,
        so it is adopted rather than reported.
        """
        keys = [stream_key(stream_prefix, index) for index in shards]
        kinds = await self._each(keys, lambda pipe, key: pipe.type(key))
        streams = [key for key, kind in zip(keys, kinds, strict=True) if _text(kind) == "stream"]
        lengths = dict(zip(streams, await self._each(streams, lambda p, k: p.xlen(k)), strict=True))
        found = [
            f"{key} ({_text(kind)})"
            for key, kind in zip(keys, kinds, strict=True)
            if _text(kind) not in ("none", "stream")
        ]
        found += [f"{key} (non-empty stream)" for key, n in lengths.items() if int(n) > 0]
        return sorted(found)

    async def provision(self, stream_prefix: str, shards: Sequence[int], group: str | None) -> None:
        """Make the streams of ``shards`` exist, with ``group`` created at ``0`` when given.

        ``0`` rather than ``$``: on a brand-new stream both are the same, and on
        an existing one a new group must not silently skip what producers
        already published (at-least-once).  An existing Redis group keeps its
        position (BUSYGROUP is success).
        """
        args = [group or "", "__streamkit_provision__"]
        todo = [stream_key(stream_prefix, index) for index in shards]
        sha = self._script.sha
        for attempt in range(2):
            replies = await self._each(
                todo, lambda pipe, key: pipe.execute_command("EVALSHA", sha, 1, key, *args)
            )
            todo = [k for k, r in zip(todo, replies, strict=True) if isinstance(r, NoScriptError)]
            if not todo:
                return
            if attempt == 0:
                # A node never ran the script (a new cluster, a restart, a
                # promoted replica): SCRIPT LOAD reaches every primary.
                await self.client.script_load(scripts.PROVISION)
        raise NoScriptError(f"Redis does not keep the provisioning script ({todo[0]})")

    async def destroy_group(self, stream_prefix: str, shards: Sequence[int], group: str) -> None:
        """Remove the Redis consumer group ``group`` from the shard streams.

        A leftover group keeps its pending entries and lag forever, which
        would block every later drain proof of those shards.  A missing
        stream or group is fine (XGROUP DESTROY answers 0; a missing key
        is checked first because DESTROY on it is an error).
        """
        keys = [stream_key(stream_prefix, index) for index in shards]
        found = await self._each(keys, lambda pipe, key: pipe.exists(key))
        present = [key for key, n in zip(keys, found, strict=True) if int(n)]
        await self._each(present, lambda pipe, key: pipe.xgroup_destroy(key, group))

    async def _each(self, keys: Sequence[str], queue: _Queue) -> list[Any]:
        """One command per key, pipelined in chunks: a group of 4,096 shards is
        a few round trips, not thousands (a cluster pipeline splits by node).

        Replies come back in order; a NOSCRIPT reply is handed back for the
        caller to retry, any other error is raised as itself.
        """
        replies: list[Any] = []
        for start in range(0, len(keys), _CHUNK):
            pipe = self.client.pipeline(transaction=False)
            for key in keys[start : start + _CHUNK]:
                queue(pipe, key)
            replies += await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, Exception) and not isinstance(reply, NoScriptError):
                raise reply
        return replies


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
