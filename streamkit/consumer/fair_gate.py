"""``FairGate``: the member's in-flight budget, shared fairly by its shards.

A shard reader takes up to ``batch_size`` tokens before it reads and gives
them back once the read is handled.  Waiters are served first come, first
served, and a reader that just finished queues behind the others, so shards
take turns (round-robin) and none starves, even when the member owns far more
shards than it has tokens.
"""

from __future__ import annotations

from collections import deque

import anyio

__all__ = ["FairGate"]


class _Waiter:
    __slots__ = ("event", "granted", "want")

    def __init__(self, want: int) -> None:
        self.want = want
        self.granted = 0
        self.event = anyio.Event()


class FairGate:
    """A counting semaphore that grants in arrival order, partially if need be.

    ``acquire(n)`` returns between 1 and ``n`` tokens.  A waiter at the head of
    the queue takes what is free instead of waiting for all it asked for, so a
    large request cannot hold up the line, and nobody jumps the queue while
    anyone waits.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.available = capacity
        self._waiters: deque[_Waiter] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def try_acquire(self, want: int) -> int:
        """Tokens granted at once (0 if someone is queued or none are free)."""
        if self._waiters or self.available == 0:
            return 0
        granted = min(want, self.available)
        self.available -= granted
        return granted

    async def acquire(self, want: int) -> int:
        if want < 1:
            raise ValueError("want must be >= 1")
        granted = self.try_acquire(want)
        if granted:
            return granted
        waiter = _Waiter(want)
        self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            # Cancelled: hand back a grant that raced the cancellation, or
            # leave the queue.
            if waiter.granted:
                self.release(waiter.granted)
            else:
                self._waiters.remove(waiter)
            raise
        return waiter.granted

    def release(self, count: int) -> None:
        if count <= 0:
            return
        self.available += count
        if self.available > self.capacity:
            raise RuntimeError("FairGate released more tokens than it granted")
        while self._waiters and self.available:
            waiter = self._waiters.popleft()
            waiter.granted = min(waiter.want, self.available)
            self.available -= waiter.granted
            waiter.event.set()
