"""Micro-benchmark: shard_for_key against a bare mmh3.hash, in the same run.

Run: python bench/routing.py   (takes a few seconds)
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Callable

import mmh3

from streamkit.routing import shard_for_key

KEYS = 200_000
ROUNDS = 5


def _keys() -> list[str]:
    rng = random.Random(1)
    alphabet = string.ascii_letters + string.digits
    return [f"order-{''.join(rng.choices(alphabet, k=12))}" for _ in range(KEYS)]


def _best_rate(fn: Callable[[list[str]], object], keys: list[str]) -> float:
    # Best of several rounds: the least disturbed by the rest of the machine.
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        fn(keys)
        best = min(best, time.perf_counter() - start)
    return len(keys) / best


def _bare_mmh3(keys: list[str]) -> object:
    # The floor: the hash alone, from str, unsigned, no encode / modulo.
    h = mmh3.hash
    return [h(k, 0, False) for k in keys]


def _make_routed(n: int) -> Callable[[list[str]], object]:
    def routed(keys: list[str]) -> object:
        return [shard_for_key(k, n) for k in keys]

    return routed


def main() -> None:
    keys = _keys()
    base = _best_rate(_bare_mmh3, keys)
    print(f"{'mmh3.hash (bare, ASCII)':<30}{base / 1e6:8.2f} M keys/s")
    wide = [f"주문-{k}" for k in keys]  # non-ASCII keys take the encode path
    for label, n, sample in (
        ("shard_for_key(n=8)", 8, keys),
        ("shard_for_key(n=100)", 100, keys),
        ("shard_for_key(n=100, UTF-8)", 100, wide),
    ):
        rate = _best_rate(_make_routed(n), sample)
        print(f"{label:<30}{rate / 1e6:8.2f} M keys/s   ratio vs bare: {base / rate:.2f}x slower")


if __name__ == "__main__":
    main()
