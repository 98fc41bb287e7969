"""``@app.publisher`` stacked on a listener over real Redis and a real coordinator:
1,000 orders become 1,000 invoices, each on the shard its key routes to, and a
member crashed midway (in the process, or a ``streamkit run`` process SIGKILLed)
loses none (the repeats are counted)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from streamkit import Message, Publisher, StreamKit
from streamkit.consumer.listener import ListenerConfigError
from streamkit.coordinator_client import CoordinatorClient
from streamkit.routing import shard_for_key
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit.testing.members import crash_member

from .apps.orders import Invoice, Order, invoice_for
from .conftest import AppFactory
from .support import Admin, InProcessApp, eventually, nothing_pending, serving, text

ORDERS, INVOICE_SHARDS = 1000, 4


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_a_thousand_orders_become_a_thousand_invoices_despite_a_crash(
    coordinator: CoordinatorProcess,
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    invoices = await orders_and_invoices(admin, prefix, group)
    app = make_app("invoicing")
    handled = 0

    # The publisher above the listener: the app rebinds the registered handler.
    @app.publisher(invoices, group="mailing", key=lambda invoice: invoice.customer_id)
    @app.stream_listener(stream_prefix=prefix, group=group, concurrency=2, batch_size=50)
    async def bill(order: Order) -> Invoice:
        nonlocal handled
        handled += 1
        return invoice_for(order)

    async def invoice_count() -> int:
        counts = [int(await redis.xlen(f"{invoices}:{s}")) for s in range(INVOICE_SHARDS)]
        return sum(counts)

    with anyio.fail_after(40):
        async with serving(app):
            await eventually(lambda: len(app.members) == 2, 10, "two members")
            await publish_orders(coordinator, redis, prefix, group)
            await eventually(lambda: handled >= ORDERS // 3, 10, "a third handled")
            crash_member(app, app.members[0])  # as kill -9: no drain, no acks
            await eventually(lambda: handled >= ORDERS, 20, "every order handled")
            await eventually(
                lambda: nothing_pending(redis, prefix, group, 2), 20, "every order acked"
            )
    seen = await invoices_by_order(redis, invoices, INVOICE_SHARDS)
    assert set(seen) == {f"o{n}" for n in range(ORDERS)}  # none lost
    duplicates = sum(seen.values()) - ORDERS
    print(f"invoices: {sum(seen.values())}, duplicates after the crash: {duplicates}")
    assert await invoice_count() == ORDERS + duplicates


async def orders_and_invoices(admin: Admin, prefix: str, group: str) -> str:
    """The orders' group (2 shards) and the invoice stream's ("mailing"); its prefix."""
    invoices = f"{prefix}-invoices"
    await admin.create_group(prefix, group, 2)
    await admin.create_group(invoices, "mailing", INVOICE_SHARDS)
    return invoices


async def publish_orders(
    coordinator: CoordinatorProcess, redis: Any, prefix: str, group: str
) -> None:
    """``ORDERS`` orders of 37 customers (the keys), through a ``Publisher``."""
    user, password = coordinator.admin_auth
    async with CoordinatorClient(coordinator.url, username=user, password=password) as client:
        orders = Publisher(prefix, group, coordinator=client, redis=redis)
        await orders.publish_many(
            (f"c{n % 37}", Order(order_id=f"o{n}", customer_id=f"c{n % 37}", amount=n))
            for n in range(ORDERS)
        )


async def invoices_by_order(redis: Any, invoices: str, shards: int) -> dict[str, int]:
    """Invoice count per order id; checks that each is on the shard its key routes to."""
    seen: dict[str, int] = {}
    for shard in range(shards):
        for _, fields in await redis.xrange(f"{invoices}:{shard}"):
            invoice = Invoice.model_validate(json.loads(text(fields[b"payload"])))
            assert shard_for_key(invoice.customer_id, shards) == shard
            seen[invoice.order_id] = seen.get(invoice.order_id, 0) + 1
    return seen


@pytest.mark.long  # ~15-30 s: two `streamkit run` processes; run with -m long
@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_a_sigkilled_process_loses_no_invoice(
    coordinator: CoordinatorProcess,
    admin: Admin,
    redis: Any,
    names: tuple[str, str],
    app_process: AppFactory,
) -> None:
    prefix, group = names
    invoices = await orders_and_invoices(admin, prefix, group)
    options = {"module": "invoicing", "invoices": invoices, "sleep_ms": 2}
    victim = app_process("victim", prefix, group, **options)
    survivor = app_process("survivor", prefix, group, **options)

    await publish_orders(coordinator, redis, prefix, group)

    async def invoiced_at_least(count: int) -> bool:
        return len(await invoices_by_order(redis, invoices, INVOICE_SHARDS)) >= count

    await eventually(lambda: invoiced_at_least(ORDERS // 4), 30, "a quarter invoiced")
    victim.kill()  # SIGKILL: no drain, no acks, no leave
    await eventually(lambda: invoiced_at_least(ORDERS), 30, "every order invoiced")
    seen = await invoices_by_order(redis, invoices, INVOICE_SHARDS)
    assert set(seen) == {f"o{n}" for n in range(ORDERS)}  # none lost
    total = sum(seen.values())
    print(f"invoices: {total}, duplicates after SIGKILL: {total - ORDERS}")
    survivor.assert_running()
    await survivor.terminate()


def test_publisher_order_of_decorators_and_its_refusals() -> None:
    app = StreamKit()
    invoices = app.publisher("invoices", group="mailing", key=lambda invoice: invoice.order_id)

    @app.stream_listener(stream_prefix="orders", group="billing")
    @invoices
    async def below(order: Order, msg: Message) -> Invoice:  # acked by the listener
        return Invoice(order_id=order.order_id, customer_id=order.customer_id, total=1)

    assert app.listeners[0].handler is below and app.listeners[0].options.auto_ack
    with pytest.raises(ListenerConfigError, match="auto_ack=False with a @publisher"):
        app.stream_listener(stream_prefix="orders", group="audit", auto_ack=False)(invoices(below))
    with pytest.raises(TypeError, match="needs an async function"):
        invoices(lambda order: order)
    with pytest.raises(TypeError, match="has no key"):
        app.publisher("plain", group="mailing")(below)
