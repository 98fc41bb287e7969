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
from collections.abc import Callable, Coroutine, Sequence
from typing import Final, TypeAlias

import anyio
from redis.commands.core import AsyncScript

from streamkit.routing import stream_key
from streamkit_server.errors import CoordinatorError
from streamkit_server.store import scripts
from streamkit_server.store.records import RedisClient

__all__ = [
    "MAX_NAME_LENGTH",
    "Provisioner",
    "unsafe_char",
    "validate_consumer_group",
    "validate_member_id",
    "validate_stream_prefix",
]

MAX_NAME_LENGTH: Final = 200
# Braces would change the cluster hash tag of our keys; whitespace and control
# characters make keys and logs ambiguous; '/' and '%' cannot travel safely in
# one URL path segment.
_FORBIDDEN = re.compile(r"[\s{}/%\x00-\x1f\x7f]")
_PARALLEL = 32
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ShardFn: TypeAlias = Callable[[int], Coroutine[object, object, None]]


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
        found: list[str] = []

        async def check(index: int) -> None:
            key = stream_key(stream_prefix, index)
            kind = await self.client.type(key)
            kind_s = kind.decode() if isinstance(kind, bytes) else str(kind)
            if kind_s == "none":
                return
            if kind_s != "stream":
                found.append(f"{key} ({kind_s})")
            elif await self.client.xlen(key) > 0:
                found.append(f"{key} (non-empty stream)")

        await self._each(shards, check)
        return sorted(found)

    async def provision(self, stream_prefix: str, shards: Sequence[int], group: str | None) -> None:
        """Make the streams of ``shards`` exist, with ``group`` created at ``0`` when given.

        ``0`` rather than ``$``: on a brand-new stream both are the same, and on
        an existing one a new group must not silently skip what producers
        already published (at-least-once).  An existing Redis group keeps its
        position (BUSYGROUP is success).
        """

        async def one(index: int) -> None:
            await self._script(
                keys=[stream_key(stream_prefix, index)],
                args=[group or "", "__streamkit_provision__"],
            )

        await self._each(shards, one)

    async def destroy_group(self, stream_prefix: str, shards: Sequence[int], group: str) -> None:
        """Remove the Redis consumer group ``group`` from the shard streams.

        A leftover group keeps its pending entries and lag forever, which
        would block every later drain proof of those shards.  A missing
        stream or group is fine (XGROUP DESTROY answers 0; a missing key
        is checked first because DESTROY on it is an error).
        """

        async def one(index: int) -> None:
            key = stream_key(stream_prefix, index)
            if await self.client.exists(key):
                await self.client.xgroup_destroy(key, group)

        await self._each(shards, one)

    async def _each(self, shards: Sequence[int], fn: _ShardFn) -> None:
        # The first failure is raised as itself (not as an ExceptionGroup), so
        # callers can tell a Redis error from anything else.
        errors: list[Exception] = []

        async def guarded(shard: int) -> None:
            try:
                await fn(shard)
            except Exception as exc:
                errors.append(exc)

        for start in range(0, len(shards), _PARALLEL):
            async with anyio.create_task_group() as tg:
                for shard in shards[start : start + _PARALLEL]:
                    tg.start_soon(guarded, shard)
            if errors:
                raise errors[0]
