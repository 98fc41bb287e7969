"""Tests for streamkit.routing: SPEC §4 vectors, uniformity, key slots."""

from __future__ import annotations

import random
import string
from collections import Counter
from statistics import NormalDist

import mmh3
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from streamkit import routing
from streamkit.routing import redis_cluster_slot, shard_for_key, stream_key

SHARD_COUNTS = (3, 7, 8, 16, 100)

# SPEC §4: key -> index for n = 3, 7, 8, 16, 100.
SPEC_VECTORS = {
    "order-123": (1, 6, 5, 13, 41),
    "order-456": (1, 2, 6, 14, 66),
    "a": (2, 4, 2, 2, 50),
    "user:42": (0, 5, 5, 5, 5),
    "": (0, 0, 0, 0, 0),
    "한글키": (0, 5, 0, 0, 68),
}


@pytest.mark.parametrize(
    ("key", "shard_count", "expected"),
    [
        (key, n, indexes[i])
        for key, indexes in SPEC_VECTORS.items()
        for i, n in enumerate(SHARD_COUNTS)
    ],
)
def test_spec_vectors(key: str, shard_count: int, expected: int) -> None:
    assert shard_for_key(key, shard_count) == expected
    assert shard_for_key(key.encode("utf-8"), shard_count) == expected


def _reference_shard(data: bytes, n: int) -> int:
    """A deliberately plain transcription of SPEC §4, without any caching."""
    limit = 2**32 - (2**32 % n)
    k = 0
    while True:
        seed = 0 if k == 0 else mmh3.hash(k.to_bytes(4, "little"), 0, signed=False)
        h = mmh3.hash(data, seed, signed=False)
        if h < limit:
            return h % n
        k += 1


@pytest.mark.parametrize("bad", [0, -1, -100])
def test_shard_count_below_one_is_rejected(bad: int) -> None:
    with pytest.raises(ValueError, match="shard_count must be >= 1"):
        shard_for_key("k", bad)


def test_limit_memo_stays_small() -> None:
    for n in range(1, 500):
        shard_for_key("k", n)
    assert len(routing._LIMITS) <= 64
    with pytest.raises(TypeError):
        shard_for_key("k", 7.5)  # type: ignore[arg-type]


def test_shard_count_above_hash_space_is_rejected() -> None:
    # No 32-bit hash is below the limit then, so it could never route.
    assert shard_for_key("k", 2**32) == _reference_shard(b"k", 2**32)
    with pytest.raises(ValueError, match="<= 2\\*\\*32"):
        shard_for_key("k", 2**32 + 1)


def test_lone_surrogate_raises_instead_of_crashing() -> None:
    # mmh3 5.3.1 segfaults on such a str; we must encode first and raise.
    with pytest.raises(UnicodeEncodeError):
        shard_for_key("bad\ud800key", 8)


# n = 2**31 + 1 rejects about half of all first hashes, so it exercises the
# reseeding path that realistic shard counts almost never take.
HUGE_N = 2**31 + 1


def test_reseeding_path_matches_reference() -> None:
    limit = 2**32 - 2**32 % HUGE_N
    keys = [f"k{i}".encode() for i in range(200)]
    rejected = [k for k in keys if mmh3.hash(k, 0, signed=False) >= limit]
    assert len(rejected) > 50  # the path really ran
    for key in keys:
        assert shard_for_key(key, HUGE_N) == _reference_shard(key, HUGE_N)


def test_attempt_cap_falls_back_to_last_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    # With no reseeds left, a rejected first hash falls back to hash mod n.
    monkeypatch.setattr(routing, "_RESEEDS", ())
    limit = 2**32 - 2**32 % HUGE_N
    key = next(
        k for k in (f"k{i}".encode() for i in range(100)) if mmh3.hash(k, 0, signed=False) >= limit
    )
    assert shard_for_key(key, HUGE_N) == mmh3.hash(key, 0, signed=False) % HUGE_N


@given(
    key=st.text(max_size=64),
    n=st.one_of(st.integers(1, 1000), st.integers(1, 2**32), st.just(HUGE_N)),
)
def test_shard_properties(key: str, n: int) -> None:
    index = shard_for_key(key, n)
    assert 0 <= index < n
    assert shard_for_key(key, n) == index  # deterministic
    assert shard_for_key(key.encode("utf-8"), n) == index  # str == its UTF-8 bytes
    assert index == _reference_shard(key.encode("utf-8"), n)


@given(key=st.binary(max_size=64), n=st.integers(1, 2**16))
def test_bytes_keys_match_reference(key: bytes, n: int) -> None:
    assert shard_for_key(key, n) == _reference_shard(key, n)


def _chi_square_critical(df: int, p: float) -> float:
    """Upper-tail chi-square quantile by the Wilson-Hilferty approximation.

    At p = 1e-6 it overestimates the exact quantile by 10% at df = 2 (30.3
    vs 27.6), 4% at df = 6, < 2% from df = 15 and 0.2% at df = 99: slightly
    lax, never flaky. Avoids a scipy test dependency.
    """
    z = NormalDist().inv_cdf(1 - p)
    a = 2 / (9 * df)
    return float(df * (1 - a + z * a**0.5) ** 3)


UNIFORMITY_KEYS = 100_000


@pytest.fixture(scope="module")
def random_keys() -> list[str]:
    # Fixed seed: the test is reproducible, and the bounds below are chosen so
    # that a correct hash fails them with negligible probability for any seed.
    rng = random.Random(20240517)
    alphabet = string.ascii_letters + string.digits + ":-_"
    return ["".join(rng.choices(alphabet, k=rng.randint(8, 24))) for _ in range(UNIFORMITY_KEYS)]


@pytest.mark.parametrize("n", SHARD_COUNTS)
def test_distribution_is_uniform(random_keys: list[str], n: int) -> None:
    counts = Counter(shard_for_key(k, n) for k in random_keys)
    assert set(counts) == set(range(n))
    total = len(random_keys)
    expected = total / n
    observed = [counts[i] for i in range(n)]

    # 1. "Within 2% of uniform" as total variation distance: no set of shards
    #    gets more than 2 percentage points of traffic beyond its fair share.
    #    A per-bucket 2% bound would not be meaningful: at n = 100 a bucket's
    #    sd is ~3.1% of its mean, so a correct hash would fail it routinely.
    #    Sampling noise alone gives TV ~1.3% at n = 100 (sd ~0.1%) and < 0.5%
    #    for n <= 16, so 2% has >7 sd of margin and still catches gross skew.
    tv = sum(abs(c / total - 1 / n) for c in observed) / 2
    assert tv < 0.02, f"total variation {tv:.4f} from uniform"

    # 2. Goodness of fit: Pearson's chi-square must not be in the 1e-6 upper
    #    tail of chi2(n - 1). Catches subtler bias than (1) at any n; a correct
    #    hash fails it with probability 1e-6.
    chi2 = sum((c - expected) ** 2 / expected for c in observed)
    critical = _chi_square_critical(n - 1, 1e-6)
    assert chi2 < critical, f"chi-square {chi2:.1f} >= {critical:.1f} (df={n - 1})"

    # 3. No single shard is starved or flooded: every bucket is within 6 binomial
    #    standard deviations (P(fail) < n * 2e-9 for a correct hash).
    sd = (total * (1 / n) * (1 - 1 / n)) ** 0.5
    worst = max(abs(c - expected) for c in observed)
    assert worst < 6 * sd, f"bucket off by {worst:.0f} (> 6 sd = {6 * sd:.0f})"


def test_stream_key() -> None:
    assert stream_key("create-order", 0) == "create-order:0"
    assert stream_key("orders", 12) == "orders:12"
    with pytest.raises(ValueError):
        stream_key("orders", -1)


@pytest.mark.parametrize(
    ("key", "slot"),
    [
        # Slots from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        ("foo", 12182),
        ("123456789", 12739),  # CRC16-XMODEM check value 0x31C3
        ("{user1000}.following", 3443),
        ("{user1000}.followers", 3443),
        ("foo{}{bar}", 8363),  # empty first tag: whole key is hashed
        ("foo{{bar}}zap", redis_cluster_slot("{bar")),  # tag is "{bar"
        ("foo{bar}{zap}", redis_cluster_slot("bar")),  # only the first tag counts
        ("", 0),
    ],
)
def test_cluster_slot_known_values(key: str, slot: int) -> None:
    assert redis_cluster_slot(key) == slot
    assert redis_cluster_slot(key) == key_slot(key.encode("utf-8"))


_tagged_keys = st.builds(
    lambda a, b, c: f"{a}{{{b}}}{c}",
    st.text(max_size=8),
    st.text(max_size=8),
    st.text(max_size=8),
)


@given(key=st.one_of(st.text(max_size=40), _tagged_keys, st.text(alphabet="{}ab", max_size=12)))
def test_cluster_slot_matches_redis_py(key: str) -> None:
    slot = redis_cluster_slot(key)
    assert 0 <= slot < 16384
    assert slot == key_slot(key.encode("utf-8"))
    assert redis_cluster_slot(key.encode("utf-8")) == slot
