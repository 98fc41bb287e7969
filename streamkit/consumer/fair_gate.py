"""``FairGate``: the member's in-flight budget, shared fairly by its shards.

A shard reader takes up to ``batch_size`` tokens before it reads and gives
them back once the read is handled.  Waiters are served first come, first
served, and a reader that just finished queues behind the others, so shards
take turns (round-robin) and none starves, even when the member owns far more
shards than it has tokens.

A request takes what it asked for, or what is free if that is at least half
of it: a read of a fragment (a few tokens left over by a short read) would
cost a whole round trip for a few entries, and every later grant would stay
that small, since tokens come back in the sizes they went out.  Waiting for
half a batch lets the fragments merge again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

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

    ``acquire(n)`` returns between ``ceil(m / 2)`` and ``m`` tokens, where ``m``
    is ``n`` or the capacity if smaller.  A waiter at the head of the queue
    takes what is free once that is at least half of ``m`` instead of waiting
    for all of it, so a large request does not hold up the line for long, and
    nobody jumps the queue while anyone waits.
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
        """Tokens granted at once (0 if someone is queued or too few are free)."""
        if self._waiters:
            return 0
        granted = self._grant(want)
        self.available -= granted
        return granted

    def _grant(self, want: int) -> int:
        """What a request of ``want`` may take now: all of it, else at least half."""
        need = min(want, self.capacity)
        if self.available >= need:
            return need
        return self.available if 2 * self.available >= need else 0

    async def acquire(
        self,
        want: int,
        *,
        meanwhile: Callable[[], Awaitable[object]] | None = None,
        after_s: float = 0.0,
    ) -> int:
        """Tokens for ``want``, in turn.  ``meanwhile``: awaited once if the
        wait lasts ``after_s`` seconds; the request keeps its place in line."""
        if want < 1:
            raise ValueError("want must be >= 1")
        granted = self.try_acquire(want)
        if granted:
            return granted
        waiter = _Waiter(want)
        self._waiters.append(waiter)
        try:
            if meanwhile is not None:
                with anyio.move_on_after(after_s):
                    await waiter.event.wait()
                if not waiter.event.is_set():
                    await meanwhile()
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
        while self._waiters:
            waiter = self._waiters[0]
            granted = self._grant(waiter.want)
            if not granted:
                return
            self._waiters.popleft()
            waiter.granted = granted
            self.available -= granted
            waiter.event.set()
