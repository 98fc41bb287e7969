"""Key names of the coordinator's Redis layout: the one place that spells them.

A leaf (standard library only), so the client's test launcher can name a
coordinator's keys without importing the server.  ``kp`` is the key prefix,
default ``redis-stream:coord``; the layout is described in ``store.metadata``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DEFAULT_KEY_PREFIX: Final = "redis-stream:coord"

INDEX_SEPARATOR: Final = "\x00"


@dataclass(frozen=True, slots=True)
class GroupKeys:
    """The two keys of one group (metadata hash, mutex); they share a slot."""

    stream_prefix: str
    consumer_group: str
    metadata: str
    mutex: str

    @property
    def index_member(self) -> str:
        return f"{self.stream_prefix}{INDEX_SEPARATOR}{self.consumer_group}"


def group_keys(key_prefix: str, stream_prefix: str, consumer_group: str) -> GroupKeys:
    """The metadata hash and mutex of a group: one hash tag, so one slot."""
    tag = f"{{{stream_prefix}:{consumer_group}}}"
    return GroupKeys(
        stream_prefix=stream_prefix,
        consumer_group=consumer_group,
        metadata=f"{key_prefix}:{tag}:metadata",
        mutex=f"{key_prefix}:{tag}:mutex",
    )


def stream_record_key(key_prefix: str, stream_prefix: str) -> str:
    return f"{key_prefix}:{{{stream_prefix}}}:stream"


def stream_lock_key(key_prefix: str, stream_prefix: str) -> str:
    return f"{key_prefix}:{{{stream_prefix}}}:stream-lock"


def index_key(key_prefix: str) -> str:
    """The set of ``<streamPrefix>\\0<consumerGroup>`` the tick loop walks."""
    return f"{key_prefix}:groups"


def coordinators_key(key_prefix: str) -> str:
    """The hash of coordinator id -> the timings it runs with."""
    return f"{key_prefix}:coordinators"


def token_secret_key(key_prefix: str) -> str:
    return f"{key_prefix}:auth:token-secret"


def token_versions_key(key_prefix: str) -> str:
    return f"{key_prefix}:auth:token-versions"


def ratelimit_prefix(key_prefix: str) -> str:
    """Rate-limit counters are ``<this>:<kind>:<ident>``."""
    return f"{key_prefix}:ratelimit"


def inside_key_prefix(key_prefix: str, stream_prefix: str) -> bool:
    """Whether a stream named ``stream_prefix`` would put keys in the coordinator's namespace.

    Every coordinator key is ``<key_prefix>:…``; a stream's shard keys are
    ``<stream_prefix>:<n>``.  So a stream named like the prefix, or inside it,
    could be (or overwrite) a rate-limit counter, a token store or a group's
    metadata.  Any other valid name stays out: its shard keys start with
    ``<stream_prefix>:`` and ``<key_prefix>:`` is not a prefix of them.
    """
    return stream_prefix == key_prefix or stream_prefix.startswith(f"{key_prefix}:")
