"""Partition-key routing and Redis Cluster key slots, sans-IO.

`shard_for_key` must give the same answer as the JVM and Python clients of the
reference coordinator, so mixed fleets route a key to the same shard stream.
"""

from __future__ import annotations

from typing import Final

import mmh3

__all__ = [
    "MAX_HASH_ATTEMPTS",
    "MAX_SHARD_COUNT",
    "REDIS_CLUSTER_SLOTS",
    "redis_cluster_slot",
    "shard_for_key",
    "stream_key",
]

_HASH_SPACE: Final = 1 << 32

# A shard index is drawn from the 32-bit hash space; beyond 2**32 shards no
# hash value is below the rejection limit, so such a count can never route.
MAX_SHARD_COUNT: Final = _HASH_SPACE

# Why a cap and not `while True`: the reseeding sequence is deterministic, so a
# key that were rejected on every attempt would spin forever, and we cannot
# prove no such key exists (that would mean inverting MurmurHash3). One attempt
# is rejected with probability (2**32 mod n) / 2**32, which is < 1/2 for every
# allowed n and < 2.4e-6 for n <= 10_000; with independent-looking seeds all 64
# attempts fail with probability < 2**-64 (< 1e-350 for n <= 10_000). Nobody
# will ever observe the fallback, but it keeps the function total.
MAX_HASH_ATTEMPTS: Final = 64

# Attempt 0 hashes with seed 0; attempt k >= 1 with murmur3_32(k as 4-byte
# little-endian, seed 0). Precomputed once: they do not depend on the key.
_RESEEDS: Final[tuple[int, ...]] = tuple(
    mmh3.hash(k.to_bytes(4, "little"), 0, False) for k in range(1, MAX_HASH_ATTEMPTS)
)

REDIS_CLUSTER_SLOTS: Final = 16384


# shard_count -> rejection limit. A plain dict, not functools.lru_cache: a dict
# hit costs less than half an lru_cache call, on a path of a few of either
# (figures: docs/performance.md, "Routing hash").
# A deployment sees a handful of counts; the size cap only guards misuse.
_LIMITS: dict[int, int] = {}
_LIMITS_MAX: Final = 64


def _rejection_limit(shard_count: int) -> int:
    """Validate `shard_count` and return the largest multiple of it <= 2**32."""
    # bool is an int subclass; True as a shard count is a caller bug.
    if not isinstance(shard_count, int) or isinstance(shard_count, bool):
        raise TypeError(f"shard_count must be an int, got {type(shard_count).__name__}")
    if shard_count < 1:
        raise ValueError(
            f"shard_count must be >= 1, got {shard_count}; a stream with no shards "
            "(drained or scaled to zero) cannot route a partition key"
        )
    if shard_count > MAX_SHARD_COUNT:
        raise ValueError(f"shard_count must be <= 2**32, got {shard_count}")
    if len(_LIMITS) >= _LIMITS_MAX:
        _LIMITS.clear()
    limit = _LIMITS[shard_count] = _HASH_SPACE - _HASH_SPACE % shard_count
    return limit


def shard_for_key(partition_key: str | bytes, shard_count: int) -> int:
    """Return the shard index in ``[0, shard_count)`` for a partition key.

    A ``str`` key is hashed as its UTF-8 bytes, so ``"k"`` and ``b"k"`` agree.
    Raises ``ValueError`` for ``shard_count < 1`` and ``UnicodeEncodeError``
    for a ``str`` that is not valid Unicode (lone surrogates).
    """
    try:
        limit = _LIMITS[shard_count]
    except KeyError:  # first use of this count: validate once
        limit = _rejection_limit(shard_count)
    data = partition_key
    # mmh3 hashes a str as UTF-8 itself, but mmh3 5.3.1 crashes the interpreter
    # (SIGSEGV) on a str with a lone surrogate. An ASCII str cannot hold one
    # and skips the copy; anything else goes through a strict encode, which raises.
    if isinstance(data, str) and not data.isascii():
        data = data.encode("utf-8")
    h: int = mmh3.hash(data, 0, False)
    if h < limit:  # always true for powers of two, and almost always otherwise
        return h % shard_count
    return _rehash(data, shard_count, limit, h)


def _rehash(data: str | bytes, shard_count: int, limit: int, h: int) -> int:
    """Rejection attempts k >= 1 after a rejected hash `h`, kept out of line to
    keep the common path short."""
    for seed in _RESEEDS:
        h = mmh3.hash(data, seed, False)
        if h < limit:
            return h % shard_count
    # Unreachable in practice (see MAX_HASH_ATTEMPTS); the last hash is still a
    # deterministic function of the key, so every streamkit client agrees.
    return h % shard_count


def stream_key(stream_prefix: str, shard_index: int) -> str:
    """Return the physical stream key ``{prefix}:{index}``.

    No hash-tag braces on purpose: the shards of one logical stream must spread
    over the cluster's primaries instead of sharing a slot, which is what lets
    a stream outgrow one Redis key (and one node).
    """
    if shard_index < 0:
        raise ValueError(f"shard_index must be >= 0, got {shard_index}")
    return f"{stream_prefix}:{shard_index}"


def _crc16_table() -> tuple[int, ...]:
    # CRC16-XMODEM (CCITT polynomial 0x1021, MSB first, init 0), the variant
    # Redis Cluster uses; one entry per possible leading byte.
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC16_TABLE: Final = _crc16_table()


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16_TABLE[(crc >> 8) ^ byte]
    return crc


def redis_cluster_slot(key: str | bytes) -> int:
    """Return the Redis Cluster hash slot of a key, honouring hash tags.

    Redis hashes only the part between the first ``{`` and the next ``}`` when
    that part is non-empty; otherwise it hashes the whole key.
    """
    data = key.encode("utf-8") if isinstance(key, str) else key
    start = data.find(b"{")
    if start != -1:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return _crc16(data) % REDIS_CLUSTER_SLOTS
