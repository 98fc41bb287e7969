"""Typed payloads and batch handlers over real Redis: pydantic models decoded from
the field ``publish_json`` writes, invalid payloads dead-lettered with their
validation error, DI alongside, per-entry outcomes of a batch."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from dependency_injector import containers, providers
from dependency_injector.wiring import Provide, inject
from pydantic import BaseModel

from streamkit import Message, Publisher
from streamkit.consumer.failure import FailurePolicy, dead_letter_key
from streamkit.coordinator_client import CoordinatorClient
from streamkit.testing.coordinator import CoordinatorProcess

from .support import Admin, InProcessApp, dead_letters, eventually, serving, text

pytestmark = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)


class Order(BaseModel):
    order_id: str
    amount: int


class Services(containers.DeclarativeContainer):
    currency = providers.Object("EUR")


received: list[tuple[Order, str, str]] = []


@inject
async def on_order(order: Order, msg: Message, currency: str = Provide[Services.currency]) -> None:
    received.append((order, msg.id, currency))
    await msg.ack()


async def letters(redis: Any, key: str) -> dict[str, dict[str, str]]:
    return {letter["x-original-id"]: letter for letter in await dead_letters(redis, key)}


async def test_typed_handler_with_di_and_an_invalid_payload(
    coordinator: CoordinatorProcess,
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    received.clear()
    user, password = coordinator.admin_auth
    async with CoordinatorClient(coordinator.url, username=user, password=password) as client:
        publisher = Publisher(prefix, group, coordinator=client, redis=redis)
        first = await publisher.publish("o-1", Order(order_id="o-1", amount=5))
        second = await publisher.publish_json("o-2", {"order_id": "o-2", "amount": 7})
        invalid = await publisher.publish_json("o-3", {"order_id": "o-3", "amount": "many"})
        no_field = await publisher.publish("o-4", {"other": "x"})
        await publisher.aclose()

    app = make_app("typed", container=Services())
    app.add_listener(prefix, group, on_order)
    dlq = dead_letter_key(prefix, group)

    async def two_letters() -> bool:
        return int(await redis.xlen(dlq)) == 2

    with anyio.fail_after(20):
        async with serving(app):
            await eventually(lambda: len(received) == 2, 10, "the valid orders")
            await eventually(two_letters, 10, "the invalid ones dead-lettered")
    assert received == [
        (Order(order_id="o-1", amount=5), first.record_id, "EUR"),
        (Order(order_id="o-2", amount=7), second.record_id, "EUR"),
    ]
    dead = await letters(redis, dlq)
    bad = dead[invalid.record_id]
    # Not retried: a validation error cannot go away.
    assert bad["x-attempts"] == "1"
    assert bad["x-error"].startswith("PayloadError: invalid Order payload: amount: Input should")
    assert bad["payload"] == '{"order_id":"o-3","amount":"many"}'
    assert "has no field 'payload'" in dead[no_field.record_id]["x-error"]
    assert int((await redis.xpending(f"{prefix}:0", group))["pending"]) == 0


async def test_typed_handler_without_the_message_is_auto_acked(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    for n in range(3):
        order = Order(order_id=str(n), amount=n)
        await redis.xadd(f"{prefix}:0", {"payload": order.model_dump_json()})
    orders: list[Order] = []

    app = make_app("bare")

    @app.stream_listener(stream_prefix=prefix, group=group)
    def handle(order: Order) -> None:  # sync: runs in a worker thread
        orders.append(order)

    async def acked() -> bool:
        return int((await redis.xpending(f"{prefix}:0", group))["pending"]) == 0

    with anyio.fail_after(20):
        async with serving(app):
            await eventually(lambda: len(orders) == 3, 10, "three orders")
            await eventually(acked, 5, "acked without the handler seeing a message")
    assert [o.amount for o in orders] == [0, 1, 2]


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
async def test_batch_handlers_settle_per_entry(
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    ordered: bool,
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 1)
    key = f"{prefix}:0"
    ids = []
    for n in range(13):
        amount: object = "bad" if n == 4 else n
        payload = f'{{"order_id":"{n}","amount":{amount!r}}}'.replace("'", '"')
        ids.append(text(await redis.xadd(key, {"payload": payload})))
    batches: list[list[tuple[str, int, int]]] = []
    policy = FailurePolicy(max_attempts=2, backoff_initial_ms=20)

    app = make_app("batch")

    @app.stream_listener(
        stream_prefix=prefix, group=group, batch_size=5, ordered=ordered, failure_policy=policy
    )
    async def handle(orders: list[Order], msgs: list[Message]) -> None:
        batches.append([(m.id, o.amount, m.attempt) for o, m in zip(orders, msgs, strict=True)])
        for order, msg in zip(orders, msgs, strict=True):
            if order.amount == 7:
                await msg.nack()  # fails: retried, then dead-lettered
        # the others are acked after the batch returns (auto_ack for batches)

    dlq = dead_letter_key(prefix, group)

    async def done() -> bool:
        # Nothing pending proves nothing about entries not read yet: the last
        # one must have been delivered too.
        (info,) = [g for g in await redis.xinfo_groups(key) if text(g["name"]) == group]
        delivered = text(info["last-delivered-id"]) == ids[-1]
        pending = int((await redis.xpending(key, group))["pending"])
        return delivered and pending == 0 and int(await redis.xlen(dlq)) == 2

    with anyio.fail_after(20):
        async with serving(app):
            await eventually(done, 10, "all settled")
    dead = await letters(redis, dlq)
    assert set(dead) == {ids[4], ids[7]}
    assert dead[ids[4]]["x-attempts"] == "1" and "PayloadError" in dead[ids[4]]["x-error"]
    assert dead[ids[7]]["x-attempts"] == "2" and dead[ids[7]]["x-error"] == "nacked by the handler"
    handled = [entry for batch in batches for entry in batch]
    assert all(len(batch) <= 5 for batch in batches)
    # Everyone valid was handled once, and entry 7 once more on its retry.
    assert sorted(e[1] for e in handled) == [0, 1, 2, 3, 5, 6, 7, 7, 8, 9, 10, 11, 12]
    if ordered:
        # The retry of 7 comes before anything of the next batch.
        seen = [(e[1], e[2]) for e in handled]
        assert seen.index((7, 2)) < seen.index((10, 1))
