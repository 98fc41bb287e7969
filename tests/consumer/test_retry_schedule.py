"""The parked retries of an unordered shard (``RetrySchedule``), without Redis."""

from __future__ import annotations

from streamkit.consumer.retry_schedule import NOTHING_DUE_MS, RetrySchedule


def test_due_retries_come_out_in_stream_order_up_to_the_count() -> None:
    schedule = RetrySchedule(capacity=3)
    assert not schedule and schedule.until_due_ms(0) == NOTHING_DUE_MS
    schedule.park(b"5-0", 2, due_ms=100)
    schedule.park(b"10-0", 3, due_ms=50)
    schedule.park(b"7-1", 2, due_ms=300)
    assert schedule.full and len(schedule) == 3
    assert schedule.until_due_ms(0) == 50 and not schedule.due(49) and schedule.due(50)
    # Due at 100: the two earlier ones, in stream order (5-0 before 10-0), not due order.
    assert schedule.take_due(10, now_ms=100) == [(b"5-0", 2), (b"10-0", 3)]
    assert schedule.take_due(10, now_ms=100) == []
    assert schedule.until_due_ms(100) == 200 and not schedule.full


def test_take_due_respects_the_count_and_put_back_makes_them_due_at_once() -> None:
    schedule = RetrySchedule(capacity=10)
    for n in range(5):
        schedule.park(f"{n}-0".encode(), 2, due_ms=n)
    taken = schedule.take_due(2, now_ms=10)
    assert taken == [(b"0-0", 2), (b"1-0", 2)] and len(schedule) == 3
    schedule.put_back(taken)  # the claim failed: due now, ahead of the rest
    assert schedule.take_due(2, now_ms=0) == [(b"0-0", 2), (b"1-0", 2)]
