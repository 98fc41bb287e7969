"""The plugin's example suite: 20 tests of ``billing`` on a real redis-server and
coordinator (one of each for the session), each on its own streams.

Run it with ``cd samples/app_tests && python -m pytest -q``; ``bench/app_tests.py``
times it."""

from __future__ import annotations

import json

import pytest
from billing import Invoice, Order, build

from streamkit import StreamKit
from streamkit.testing.harness import StreamKitHarness


def billing_app(harness: StreamKitHarness) -> StreamKit:
    return build(
        harness.app(),
        orders=harness.stream_prefix,
        group=harness.group,
        invoices=f"{harness.stream_prefix}-invoices",
    )


async def invoices(harness: StreamKitHarness) -> list[Invoice]:
    redis = harness.redis
    found = []
    for shard in range(2):
        for _, fields in await redis.xrange(f"{harness.stream_prefix}-invoices:{shard}"):
            found.append(Invoice.model_validate(json.loads(fields[b"payload"])))
    return sorted(found, key=lambda invoice: invoice.order_id)


def order(n: int, amount: int) -> Order:
    return Order(order_id=f"o{n:03d}", customer_id=f"c{n % 3}", amount=amount)


@pytest.mark.parametrize("amount", [1, 5, 10, 99, 1000, 12345])
async def test_an_order_is_invoiced(streamkit_harness: StreamKitHarness, amount: int) -> None:
    async with streamkit_harness.running(billing_app(streamkit_harness)):
        handled = await streamkit_harness.send("c1", order(1, amount))
    assert not handled.dead_lettered
    expected = Invoice(order_id="o001", customer_id="c1", total=amount)
    assert await invoices(streamkit_harness) == [expected]


async def test_a_free_order_is_not_invoiced(streamkit_harness: StreamKitHarness) -> None:
    async with streamkit_harness.running(billing_app(streamkit_harness)):
        handled = await streamkit_harness.send("c1", order(1, 0))
    assert not handled.dead_lettered and await invoices(streamkit_harness) == []


@pytest.mark.parametrize("amount", [-1, -50, -1000])
async def test_a_negative_order_is_dead_lettered_after_its_retries(
    streamkit_harness: StreamKitHarness, amount: int
) -> None:
    async with streamkit_harness.running(billing_app(streamkit_harness)):
        handled = await streamkit_harness.send("c1", order(1, amount))
    assert handled.error == "ValueError: negative amount"
    assert handled.dead_letter is not None and handled.dead_letter["x-attempts"] == "5"
    assert await invoices(streamkit_harness) == []


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ('{"order_id": "o1", "customer_id": "c1", "amount": "many"}', "amount"),
        ('{"order_id": "o1", "amount": 3}', "customer_id"),
        ('{"customer_id": "c1", "amount": 3}', "order_id"),
    ],
)
async def test_a_malformed_order_is_dead_lettered_naming_the_field(
    streamkit_harness: StreamKitHarness, payload: str, field: str
) -> None:
    async with streamkit_harness.running(billing_app(streamkit_harness)):
        handled = await streamkit_harness.send("c1", {"payload": payload})
    assert handled.error is not None and f"invalid Order payload: {field}: " in handled.error
    assert handled.dead_letter is not None and handled.dead_letter["x-attempts"] == "1"


@pytest.mark.parametrize("count", [2, 10, 50])
async def test_many_orders_are_each_invoiced_once(
    streamkit_harness: StreamKitHarness, count: int
) -> None:
    async with streamkit_harness.running(billing_app(streamkit_harness)):
        for n in range(count):
            await streamkit_harness.publish(f"c{n % 3}", order(n, n + 1))
        await streamkit_harness.drain()
    assert [i.total for i in await invoices(streamkit_harness)] == [n + 1 for n in range(count)]


async def test_good_and_bad_orders_side_by_side(streamkit_harness: StreamKitHarness) -> None:
    async with streamkit_harness.running(billing_app(streamkit_harness)):
        bad = await streamkit_harness.send("c0", order(1, -1))
        good = await streamkit_harness.send("c0", order(2, 7))
    assert bad.dead_lettered and not good.dead_lettered
    assert [i.order_id for i in await invoices(streamkit_harness)] == ["o002"]


async def test_invoices_are_keyed_by_customer(streamkit_harness: StreamKitHarness) -> None:
    from streamkit.routing import shard_for_key

    async with streamkit_harness.running(billing_app(streamkit_harness)):
        for n in range(6):
            await streamkit_harness.publish("any", order(n, 1))
        await streamkit_harness.drain()
    redis = streamkit_harness.redis
    for shard in range(2):
        for _, fields in await redis.xrange(f"{streamkit_harness.stream_prefix}-invoices:{shard}"):
            invoice = Invoice.model_validate(json.loads(fields[b"payload"]))
            assert shard_for_key(invoice.customer_id, 2) == shard


def test_the_app_declares_its_invoice_stream(streamkit_harness: StreamKitHarness) -> None:
    app = billing_app(streamkit_harness)
    (declared,) = app.declared_streams()
    assert (declared.shards, declared.groups) == (2, ("mailing",))


@pytest.mark.streamkit(shards=4)
async def test_four_order_shards(streamkit_harness: StreamKitHarness) -> None:
    async with streamkit_harness.running(billing_app(streamkit_harness)):
        for n in range(8):
            await streamkit_harness.publish(f"k{n}", order(n, 2))
        await streamkit_harness.drain()
    assert len(await invoices(streamkit_harness)) == 8
