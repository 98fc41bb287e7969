"""The failure policy as pure decisions, and the handler shapes a listener accepts."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from streamkit import ListenerConfigError, Message, StreamKit
from streamkit.consumer.failure import (
    Action,
    FailurePolicy,
    PayloadError,
    dead_letter_fields,
    describe_error,
)
from streamkit.consumer.handlers import inspect_handler

policies = st.builds(
    FailurePolicy,
    max_attempts=st.integers(1, 20),
    backoff_initial_ms=st.integers(0, 1_000),
    backoff_max_ms=st.integers(1_000, 60_000),
    backoff_multiplier=st.floats(1, 4),
    jitter=st.floats(0, 1),
)


@given(policies, st.integers(1, 30), st.floats(0, 0.999))
def test_decide_retries_until_the_last_attempt_then_dead_letters(
    policy: FailurePolicy, attempt: int, rand: float
) -> None:
    decision = policy.decide(attempt, RuntimeError("x"), rand=rand)
    if attempt < policy.max_attempts:
        assert decision.action is Action.RETRY
        assert 0 <= decision.delay_ms <= policy.backoff_max_ms
    else:
        assert decision.action is Action.DEAD_LETTER
    assert decision.error == "RuntimeError: x"


@given(policies, st.integers(1, 30))
def test_backoff_grows_and_is_capped(policy: FailurePolicy, attempt: int) -> None:
    # Without the random part the delay never shrinks from one attempt to the next.
    assert policy.backoff_ms(attempt, 0.0) <= policy.backoff_ms(attempt + 1, 0.0)
    assert policy.backoff_ms(attempt, 0.0) <= policy.backoff_max_ms
    # Jitter only takes off, at most its share.
    low = policy.backoff_ms(attempt, 0.999)
    assert policy.backoff_ms(attempt, 0.0) * (1 - policy.jitter) - 1 <= low
    assert low <= policy.backoff_ms(attempt, 0.0)


def test_no_retry_halt_and_nack_delays() -> None:
    policy = FailurePolicy(
        max_attempts=3, no_retry=(KeyError,), no_retry_if=lambda e: "fatal" in str(e)
    )
    assert policy.decide(1, KeyError("k")).action is Action.DEAD_LETTER
    assert policy.decide(1, PayloadError("bad")).action is Action.RETRY  # replaced the default
    assert policy.decide(1, ValueError("fatal")).action is Action.DEAD_LETTER
    nack = policy.decide(1, None, delay_ms=1234)
    assert (nack.action, nack.delay_ms, nack.error) == (Action.RETRY, 1234, "nacked by the handler")
    assert policy.decide(3, None).action is Action.DEAD_LETTER
    halting = FailurePolicy(max_attempts=2, on_exhausted="halt")
    assert halting.decide(1, RuntimeError()).action is Action.RETRY
    assert halting.decide(2, RuntimeError()).action is Action.HALT
    assert FailurePolicy().decide(1, PayloadError("bad")).action is Action.DEAD_LETTER


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"backoff_initial_ms": 10, "backoff_max_ms": 5},
        {"jitter": 1.5},
        {"on_exhausted": "skip"},
        {"dead_letter_maxlen": 0},
    ],
)
def test_invalid_policies_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        FailurePolicy(**options)


def test_dead_letter_fields_and_bounded_errors() -> None:
    error = describe_error(ValueError("x" * 5000), 100)
    assert len(error) == 100 and error.startswith("ValueError: xxx") and error.endswith("…")
    fields = dead_letter_fields(
        {b"payload": b"{}", b"x-attempts": b"9"},
        stream_key="orders:3",
        entry_id="1-0",
        consumer_group="billing",
        attempts=4,
        error="E: e",
        failed_at_ms=1700,
    )
    assert fields == {
        b"payload": b"{}",
        "x-original-stream": "orders:3",
        "x-original-id": "1-0",
        "x-group": "billing",
        "x-attempts": "4",
        "x-error": "E: e",
        "x-failed-at": "1700",
    }
    assert FailurePolicy().dead_letter_key("orders", "billing") == "orders/dlq/billing"
    assert FailurePolicy(dead_letter_stream="dead").dead_letter_key("orders", "billing") == "dead"


class Order(BaseModel):
    order_id: str


async def plain(msg: Message) -> None: ...
async def typed(order: Order) -> None: ...
async def typed_with_message(order: Order, msg: Message) -> None: ...
async def batch_of_messages(msgs: list[Message]) -> None: ...
async def batch_of_orders(orders: list[Order], msgs: list[Message]) -> None: ...
def unannotated(msg):  # type: ignore[no-untyped-def]
    return None


@pytest.mark.parametrize(
    ("handler", "batch", "model", "with_message"),
    [
        (plain, False, None, False),
        (unannotated, False, None, False),
        (typed, False, Order, False),
        (typed_with_message, False, Order, True),
        (batch_of_messages, True, None, False),
        (batch_of_orders, True, Order, True),
    ],
)
def test_handler_shapes(handler: Any, batch: bool, model: Any, with_message: bool) -> None:
    shape = inspect_handler(handler)
    assert (shape.batch, shape.model, shape.with_message) == (batch, model, with_message)
    assert inspect_handler(unannotated, batch=True).batch


async def too_many(order: Order, msg: Message, other: str) -> None: ...
async def message_second(msg: Message, other: Message) -> None: ...


@pytest.mark.parametrize(
    ("handler", "options", "match"),
    [
        (too_many, {}, "cannot fill: other"),
        (message_second, {}, "only filled when the first is a typed payload"),
        (batch_of_messages, {"batch": False}, "batch=False"),
        (plain, {"batch": True}, "list"),
        (typed, {"auto_ack": False}, "nothing could ever ack them"),
        (plain, {"failure_policy": "retry"}, "must be a FailurePolicy"),
    ],
)
def test_handler_mistakes_fail_at_declaration(
    handler: Any, options: dict[str, Any], match: str
) -> None:
    app = StreamKit()
    with pytest.raises(ListenerConfigError, match=match):
        app.stream_listener(stream_prefix="orders", group="billing", **options)(handler)
