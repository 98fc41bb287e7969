"""What the store hands out: loaded groups, commit results, its errors, and unique ids."""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass
from typing import Final, TypeAlias

import redis.asyncio

from streamkit_server.core import LAYOUT_VERSION, GroupMetadata
from streamkit_server.store.keys import GroupKeys

RedisClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster


class StoreError(Exception):
    """Metadata exists but cannot be used: fail closed."""

    error_code = "METADATA_CORRUPT"


class MetadataUnsupported(StoreError):
    error_code = "METADATA_SCHEMA_UNSUPPORTED"


class MetadataCorrupt(StoreError):
    error_code = "METADATA_CORRUPT"


class MutexBusy(Exception):
    """The group mutex is held by someone else (``load`` with a token)."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """One group as read from Redis. ``group`` must be treated as immutable."""

    keys: GroupKeys
    revision: int
    #: Random id of the write that produced ``revision``: after a restore the
    #: same revision number can come back with other contents.
    write_id: str
    updated_at: str
    group: GroupMetadata
    #: The layout found in Redis; a v1 group is rewritten as v2 on its next write.
    layout_version: int = LAYOUT_VERSION


@dataclass(frozen=True, slots=True)
class CommitResult:
    ok: bool
    revision: int | None
    loaded: Loaded | None
    #: Refused: another Redis server incarnation stamped the group last.
    server_changed: bool = False


# Write ids and mutex tokens need only be unique (no one guesses them: every
# writer is a coordinator).  A random per-process prefix and a counter are
# that, without a system call for random bytes twice per heartbeat.
_ID_PREFIX: Final = secrets.token_hex(6)
_ID_COUNTER = itertools.count()


def unique_id() -> str:
    """A write id or mutex token no other write or holder has, in any process."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):x}"
