"""The helpers the consumer and publisher share: one backoff, one way to find
an error inside a task group's exception group, one forwarding descriptor."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamkit.backoff import jittered_backoff
from streamkit.errors import StreamkitError, first_leaf
from streamkit.forwarding import Forward, WritableForward


@given(
    attempt=st.integers(min_value=-3, max_value=500),
    initial=st.floats(min_value=0, max_value=10_000),
    spread=st.floats(min_value=0, max_value=100_000),
    multiplier=st.floats(min_value=1, max_value=10),
    jitter=st.floats(min_value=0, max_value=1),
    rand=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_stays_between_the_jittered_floor_and_the_ceiling(
    attempt: int,
    initial: float,
    spread: float,
    multiplier: float,
    jitter: float,
    rand: float,
) -> None:
    maximum = initial + spread
    delay = jittered_backoff(attempt, initial, maximum, rand, multiplier=multiplier, jitter=jitter)
    ceiling = jittered_backoff(attempt, initial, maximum, 0.0, multiplier=multiplier, jitter=jitter)
    assert ceiling <= maximum
    assert ceiling * (1 - jitter) - 1e-9 <= delay <= ceiling
    # The ceiling never shrinks from one attempt to the next.
    later = jittered_backoff(attempt + 1, initial, maximum, 0.0, multiplier=multiplier)
    assert ceiling <= later


def test_backoff_doubles_from_the_initial_delay_up_to_the_cap() -> None:
    ceilings = [jittered_backoff(n, 100, 1_000, 0.0) for n in range(1, 7)]
    assert ceilings == [100, 200, 400, 800, 1_000, 1_000]
    # Half jitter: the delay lies in (ceiling / 2, ceiling].
    assert jittered_backoff(3, 100, 1_000, 0.999_999) > 200


class _Refused(StreamkitError):
    pass


def test_first_leaf_finds_an_error_in_nested_groups() -> None:
    wanted = _Refused("group not found")
    group = BaseExceptionGroup(
        "outer", [ValueError("x"), BaseExceptionGroup("inner", [KeyError("k"), wanted])]
    )
    assert first_leaf(group, StreamkitError) is wanted
    assert first_leaf(group, LookupError) is group.exceptions[1].exceptions[0]  # type: ignore[attr-defined]
    assert first_leaf(ExceptionGroup("none", [ValueError("x")]), StreamkitError) is None


class _Part:
    count = 0
    label = "a"


class _Owner:
    def __init__(self) -> None:
        self._part = _Part()

    count = Forward[int]("_part", doc="The part's count.")
    renamed = Forward[int]("_part", "count")
    label = WritableForward[str]("_part")


def test_forward_reads_and_writes_through_to_the_part() -> None:
    owner = _Owner()
    owner._part.count = 3
    assert (owner.count, owner.renamed) == (3, 3)
    owner.label = "b"
    assert owner._part.label == "b" and owner.label == "b"
    # As a property without a setter: assigning fails, no instance attribute hides the view.
    with pytest.raises(AttributeError, match=r"_Owner\.count is read-only"):
        owner.count = 4  # type: ignore[assignment]
    assert owner.count == 3 and "count" not in vars(owner)
    assert _Owner.count.__doc__ == "The part's count."
