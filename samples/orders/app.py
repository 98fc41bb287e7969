"""Orders sample app.

Every order published to the ``orders`` stream is billed once per order id by
the ``billing`` group, and an invoice is published to the ``invoices`` stream.
The repository and the invoice service come from a dependency-injector
container; the invoice service gets the app's ``Publisher`` injected.

Orders are typed: a publisher sends an ``Order`` model (``publisher.publish(
order.order_id, order)`` writes its JSON to the ``payload`` field), and the
handler receives it decoded and validated.  An order that cannot be decoded,
or that still fails after the policy's last attempt, lands in the dead-letter
stream ``orders/dlq/billing``; look at it with::

    streamkit dlq list orders billing
    # after a fix; order_id is the key the publisher routes orders by
    streamkit dlq replay orders billing --payload-key order_id

Run it on your machine, with a private Redis and coordinator (the streams it
declares below are created at start; Ctrl-C stops everything)::

    streamkit dev samples.orders.app:app

With ``SAMPLES_ORDERS_IDEMPOTENT=1`` (what ``streamkit demo --idempotent``
sets) the billing listener is idempotent: an order id is billed once by a
marker and staged effects committed with the ack, and invoices are published
with the order id as their idempotency id (docs/consumer.md, "Idempotency").

or against running ones, with credentials that may heartbeat (and, to create
what is missing, the WRITE role)::

    STREAMKIT_COORDINATOR_USERNAME=admin STREAMKIT_COORDINATOR_PASSWORD=... \
        streamkit run samples.orders.app:app
"""

from __future__ import annotations

import logging
import os
from decimal import Decimal

from dependency_injector import containers, providers
from dependency_injector.wiring import Provide, inject
from pydantic import BaseModel, Field

from streamkit import FailurePolicy, Message, Publisher, StreamKit
from streamkit.connections import AsyncRedis

ORDERS = "orders"
BILLING = "billing"
INVOICES = "invoices"
ACCOUNTING = "accounting"

log = logging.getLogger("samples.orders")
IDEMPOTENT = os.environ.get("SAMPLES_ORDERS_IDEMPOTENT") == "1"


class Order(BaseModel):
    """What the ``orders`` stream carries, as JSON in the ``payload`` field."""

    order_id: str = Field(min_length=1)
    amount: Decimal = Field(ge=0)


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

    async def issue(self, order: Order, idempotency_id: str | None = None) -> None:
        # Keyed by order id: every invoice of an order lands on one shard.
        await self._publisher.publish(
            order.order_id,
            {"orderId": order.order_id, "amount": str(order.amount)},
            idempotency_id=idempotency_id,
        )


class Container(containers.DeclarativeContainer):
    redis = providers.Dependency(instance_of=object)
    invoices_publisher = providers.Dependency(instance_of=Publisher)
    orders = providers.Singleton(OrderRepository, redis=redis)
    invoices = providers.Singleton(InvoiceService, publisher=invoices_publisher)


container = Container()
app = StreamKit(container=container)
# The streams this app needs: created at start when missing (with the groups
# its listener and publisher use), never resharded if they exist.
app.stream(ORDERS, shards=8)
app.stream(INVOICES, shards=4)
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


@app.stream_listener(
    stream_prefix=ORDERS,
    group=BILLING,
    concurrency=2,
    batch_size=50,
    # A failing order is retried 5 times (0.2 s, 0.4 s, ... apart) while the
    # later orders of its shard wait, then it goes to orders/dlq/billing.
    failure_policy=FailurePolicy(max_attempts=5, backoff_initial_ms=200),
    idempotent=IDEMPOTENT,
)
@inject
async def bill_order(
    order: Order,
    msg: Message,
    orders: OrderRepository = Provide[Container.orders],
    invoices: InvoiceService = Provide[Container.invoices],
) -> None:
    if IDEMPOTENT:
        # An invoice published again has the same id: the first one is kept.
        await invoices.issue(order, idempotency_id=f"invoice-{order.order_id}")
        # Committed with the ack, once per order id: per-shard keys (the
        # shard's cluster slot), summed by the demo.
        msg.effects.sadd(msg.effects.key("billed"), order.order_id)
        msg.effects.incrby(msg.effects.key("deliveries"), 1)
        await msg.ack()
        return
    # Invoice first, then remember the order: a crash in between issues the
    # invoice again on redelivery (at-least-once), never loses it.
    if not await orders.is_billed(order.order_id):
        await invoices.issue(order)
    await orders.mark_billed(order.order_id)
    await msg.ack()
