"""Orders sample app.

Every order published to the ``orders`` stream is billed once per order id by
the ``billing`` group, and an invoice is published to the ``invoices`` stream.
The repository and the invoice service come from a dependency-injector
container; the invoice service gets the app's ``Publisher`` injected.

Run it (coordinator and Redis up, the ``orders`` and ``invoices`` streams
created; ``streamkit demo`` does all of that for you), with the coordinator's
credentials (heartbeats and routing need them)::

    STREAMKIT_COORDINATOR_USERNAME=admin STREAMKIT_COORDINATOR_PASSWORD=... \
        streamkit run samples.orders.app:app
"""

from __future__ import annotations

import logging

from dependency_injector import containers, providers
from dependency_injector.wiring import Provide, inject

from streamkit import Message, Publisher, StreamKit
from streamkit.connections import AsyncRedis

ORDERS = "orders"
BILLING = "billing"
INVOICES = "invoices"
ACCOUNTING = "accounting"

log = logging.getLogger("samples.orders")


class OrderRepository:
    """Remembers which orders were billed, so a redelivered order is not billed twice.

    Kept in Redis (one set, one counter) so that several consumer processes
    share it and the demo can count deliveries against unique orders.
    """

    BILLED = "samples:orders:billed"
    DELIVERIES = "samples:orders:deliveries"

    def __init__(self, redis: AsyncRedis) -> None:
        self._redis = redis

    async def is_billed(self, order_id: str) -> bool:
        return bool(await self._redis.sismember(self.BILLED, order_id))

    async def mark_billed(self, order_id: str) -> bool:
        """Record the order; True the first time this order id is seen."""
        await self._redis.incr(self.DELIVERIES)
        return bool(await self._redis.sadd(self.BILLED, order_id))


class InvoiceService:
    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher

    async def issue(self, order_id: str, amount: str) -> None:
        # Keyed by order id: every invoice of an order lands on one shard.
        await self._publisher.publish(order_id, {"orderId": order_id, "amount": amount})


class Container(containers.DeclarativeContainer):
    redis = providers.Dependency(instance_of=object)
    invoices_publisher = providers.Dependency(instance_of=Publisher)
    orders = providers.Singleton(OrderRepository, redis=redis)
    invoices = providers.Singleton(InvoiceService, publisher=invoices_publisher)


container = Container()
app = StreamKit(container=container)
app.publisher(stream_prefix=INVOICES, group=ACCOUNTING, provide_as="invoices_publisher")


@app.on_startup
async def share_redis() -> None:
    # The app's Redis client is created from STREAMKIT_REDIS_URL at startup;
    # the repository uses the same connection pool.
    container.redis.override(providers.Object(app.redis))
    log.info("orders sample started")


@app.on_shutdown
async def goodbye() -> None:
    log.info("orders sample stopped")


@app.stream_listener(stream_prefix=ORDERS, group=BILLING, concurrency=2, batch_size=50)
@inject
async def bill_order(
    msg: Message,
    orders: OrderRepository = Provide[Container.orders],
    invoices: InvoiceService = Provide[Container.invoices],
) -> None:
    order_id = msg.fields["orderId"]
    # Invoice first, then remember the order: a crash in between issues the
    # invoice again on redelivery (at-least-once), never loses it.
    if not await orders.is_billed(order_id):
        await invoices.issue(order_id, msg.fields.get("amount", "0"))
    await orders.mark_billed(order_id)
    await msg.ack()
