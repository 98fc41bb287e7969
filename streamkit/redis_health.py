"""Whether a member still reaches the Redis that holds its shards (sans-IO).

A member whose Redis does not answer keeps heartbeating, so without this rule
it would hold its shards for as long as it runs and no member that *can* read
them would get them.  The reader records the outcome of every read and ack;
the member runtime asks ``should_release`` and, once it says yes, gives its
shards back and leaves until Redis answers again.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.exceptions import ResponseError

__all__ = ["RedisReachability", "describe_error", "is_unreachable_error"]


def describe_error(exc: BaseException) -> str:
    """``Type: message``: redis-py's ``repr`` of a connection error is only
    ``network:ConnectionError``, without the address its message names."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def is_unreachable_error(exc: BaseException) -> bool:
    """A failure that says Redis could not be reached (not an error reply:
    a Redis that answers ``NOGROUP`` is reachable, the group is the problem)."""
    return not isinstance(exc, ResponseError)


@dataclass(slots=True)
class RedisReachability:
    """The outcome of a member's Redis reads and acks, over time.

    Times are monotonic milliseconds from the caller's clock.  Only a failure
    starts the count: an idle member that reads nothing is not unreachable.
    """

    #: When the first failure since the last success happened (None: healthy).
    failing_since_ms: int | None = None
    last_error: BaseException | None = None

    def succeeded(self) -> None:
        self.failing_since_ms = None
        self.last_error = None

    def failed(self, now_ms: int, error: BaseException) -> None:
        if self.failing_since_ms is None:
            self.failing_since_ms = now_ms
        self.last_error = error

    def failing_for_ms(self, now_ms: int) -> int:
        """How long Redis has failed without a success in between (0: it has not)."""
        if self.failing_since_ms is None:
            return 0
        return max(0, now_ms - self.failing_since_ms)

    def should_release(self, now_ms: int, release_after_ms: int) -> bool:
        return self.failing_since_ms is not None and (
            self.failing_for_ms(now_ms) >= release_after_ms
        )
