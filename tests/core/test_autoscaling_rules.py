"""recommend(): the autoscaling signal as a pure function of shard samples."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamkit_server.core.autoscaling import (
    GroupSample,
    ShardSample,
    handled_total,
    recommend,
    throughput,
)


def sample(at_ms: int, *shards: tuple[int | None, int, int | None]) -> GroupSample:
    return GroupSample(at_ms, tuple(ShardSample(i, *s) for i, s in enumerate(shards)))


def test_backlog_is_lag_plus_pending_and_the_ceiling_is_shards_over_concurrency() -> None:
    now = sample(0, (30, 5, 40), (0, 0, 10), (None, 2, 7))
    advice = recommend([now], shard_count=3, concurrency=2, target_lag=10)
    assert (advice.backlog.lag, advice.backlog.pending, advice.backlog.lag_unknown_shards) == (
        30, 7, (2,),
    )  # fmt: skip
    assert advice.backlog.total == 37
    assert advice.max_useful_replicas == 2
    assert advice.recommended_replicas == 2  # ceil(37 / 10) = 4, capped at ceil(3 / 2)
    assert advice.throughput.per_second is None  # one sample: no rate yet


def test_throughput_counts_acknowledged_entries_between_the_window_ends() -> None:
    first = sample(0, (0, 0, 100), (0, 10, 50))
    last = sample(10_000, (0, 0, 300), (0, 0, 60))  # +200 and +(60 - 40) = 220 in 10 s
    advice = recommend([first, last], shard_count=2, concurrency=1, target_lag=100)
    assert advice.throughput.per_second == pytest.approx(22.0)
    assert advice.throughput.window_seconds == 10
    # Busy without a backlog: one process stays; idle: zero.
    assert advice.recommended_replicas == 1
    idle = recommend([last, sample(20_000, (0, 0, 300), (0, 0, 60))], 2, 1, 100)
    assert idle.throughput.per_second == 0 and idle.recommended_replicas == 0


def test_a_shard_that_appears_in_the_window_does_not_count_its_history() -> None:
    first = sample(0, (0, 0, 5))
    last = sample(1_000, (0, 0, 5), (0, 0, 1_000_000))
    assert throughput([first, last]).per_second == 0


def test_unknown_lag_keeps_one_process() -> None:
    assert recommend([sample(0, (None, 0, None))], 1, 1, 10).recommended_replicas == 1


@pytest.mark.parametrize(("concurrency", "target"), [(0, 1), (1, 0), (-1, 5)])
def test_bad_parameters_raise(concurrency: int, target: int) -> None:
    with pytest.raises(ValueError):
        recommend([sample(0)], 1, concurrency, target)
    with pytest.raises(ValueError):
        recommend([], 1, 1, 1)


shard = st.tuples(
    st.one_of(st.none(), st.integers(0, 10**9)), st.integers(0, 10**6), st.integers(0, 10**9)
)


@given(
    st.lists(shard, min_size=1, max_size=40),
    st.integers(1, 64),
    st.integers(1, 10**6),
)
def test_never_more_than_useful_and_monotone_in_backlog(
    shards: list[tuple[int | None, int, int | None]], concurrency: int, target: int
) -> None:
    now = sample(0, *shards)
    advice = recommend([now], len(shards), concurrency, target)
    assert 0 <= advice.recommended_replicas <= advice.max_useful_replicas
    assert advice.max_useful_replicas == -(-len(shards) // concurrency)
    more = sample(0, *[((lag or 0) + target, p, r) for lag, p, r in shards])
    assert recommend([more], len(shards), concurrency, target).recommended_replicas >= (
        advice.recommended_replicas
    )
    assert handled_total(now) >= 0
