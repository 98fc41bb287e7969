"""``RetrySchedule``: the failed entries of an unordered shard waiting for their retry.

An unordered shard does not wait for a failed entry: it parks the entry's id
here and reads on; a due retry rides along with the next read (``XCLAIM``
to the member itself, which adds one to Redis' delivery counter).  Only ids
are kept (the fields come back with the ``XCLAIM``), with the delivery count
the claim will give the entry, and at most ``capacity`` of them: when the
schedule is full the shard reads nothing new until a retry is due.  Times
are the caller's monotonic milliseconds.
"""

from __future__ import annotations

import heapq

from streamkit.consumer.shard_io import id_key

__all__ = ["RetrySchedule"]

#: What ``until_due_ms`` answers when nothing is parked.
NOTHING_DUE_MS = 1 << 30


class RetrySchedule:
    """Parked retries of one shard: (due ms, entry id, delivery count after the claim)."""

    __slots__ = ("_heap", "capacity")

    def __init__(self, capacity: int) -> None:
        self._heap: list[tuple[int, bytes, int]] = []
        self.capacity = capacity

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def full(self) -> bool:
        return len(self._heap) >= self.capacity

    def park(self, entry_id: bytes, delivery_count: int, due_ms: int) -> None:
        """Retry ``entry_id`` at ``due_ms``; the claim makes it delivery ``delivery_count``."""
        heapq.heappush(self._heap, (due_ms, entry_id, delivery_count))

    def until_due_ms(self, now_ms: int) -> int:
        """How long until the first retry is due (0: now)."""
        if not self._heap:
            return NOTHING_DUE_MS
        return max(0, self._heap[0][0] - now_ms)

    def due(self, now_ms: int) -> bool:
        return bool(self._heap) and self._heap[0][0] <= now_ms

    def take_due(self, count: int, now_ms: int) -> list[tuple[bytes, int]]:
        """Up to ``count`` due retries, in stream order: (id, delivery count)."""
        heap = self._heap
        due: list[tuple[bytes, int]] = []
        while heap and heap[0][0] <= now_ms and len(due) < count:
            _, entry_id, delivery = heapq.heappop(heap)
            due.append((entry_id, delivery))
        due.sort(key=lambda item: id_key(item[0]))
        return due

    def put_back(self, due: list[tuple[bytes, int]]) -> None:
        """Retries taken with ``take_due`` that could not be sent: due at once."""
        for entry_id, delivery in due:
            heapq.heappush(self._heap, (0, entry_id, delivery))
