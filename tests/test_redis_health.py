"""When a member counts its Redis as unreachable (pure rule, property-tested)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import ConnectionError, ResponseError

from streamkit.redis_health import RedisReachability, describe_error, is_unreachable_error

RELEASE_AFTER = 1_000

# (time step in ms, outcome): True a success, False a failure.
events = st.lists(st.tuples(st.integers(0, 800), st.booleans()), max_size=40)


@given(events, st.integers(0, 5_000))
def test_release_only_after_failing_without_a_success_for_the_bound(
    history: list[tuple[int, bool]], later: int
) -> None:
    reach = RedisReachability()
    now = 0
    first_failure: int | None = None  # first failure since the last success
    for step, ok in history:
        now += step
        if ok:
            reach.succeeded()
            first_failure = None
        else:
            reach.failed(now, ConnectionError("down"))
            first_failure = now if first_failure is None else first_failure
    now += later
    expected = first_failure is not None and now - first_failure >= RELEASE_AFTER
    assert reach.should_release(now, RELEASE_AFTER) is expected
    assert reach.failing_for_ms(now) == (0 if first_failure is None else now - first_failure)


def test_an_error_reply_is_not_unreachable() -> None:
    assert not is_unreachable_error(ResponseError("NOGROUP No such key"))
    assert is_unreachable_error(ConnectionError("Error 111 connecting to 127.0.0.1:1."))
    assert is_unreachable_error(OSError("no route to host"))


def test_describe_error_keeps_the_address_the_repr_hides() -> None:
    exc = ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")
    assert describe_error(exc) == (
        "ConnectionError: Error 111 connecting to 127.0.0.1:6390. Connection refused."
    )
    assert describe_error(TimeoutError()) == "TimeoutError"
