"""Web orders sample: an HTTP endpoint publishes, a listener consumes.

``POST /orders`` publishes the order to the ``web-orders`` stream (keyed by
order id) and answers 202; the ``fulfilment`` listener handles it in the same
process and records it in Redis; ``GET /orders/{id}`` says whether it was
handled.  ``streamkit_lifespan`` runs the listeners with the web server and
drains them when it stops.  Run it (coordinator and Redis up, the group
created, the coordinator's credentials in ``STREAMKIT_*``)::

    uvicorn samples.web_orders.app:web --host 127.0.0.1 --port 8000

``WEB_ORDERS_PREFIX`` / ``WEB_ORDERS_GROUP`` change the stream and group.
"""

from __future__ import annotations

import os

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from streamkit import Message, StreamKit
from streamkit.asgi import streamkit_lifespan
from streamkit.observability.tracing import TracingMiddleware

PREFIX = os.environ.get("WEB_ORDERS_PREFIX", "web-orders")
GROUP = os.environ.get("WEB_ORDERS_GROUP", "fulfilment")


class Order(BaseModel):
    order_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    item: str = Field(min_length=1, max_length=200)
    quantity: int = Field(ge=1, le=1000)


sk = StreamKit(middlewares=[TracingMiddleware()])
orders = sk.publisher(stream_prefix=PREFIX, group=GROUP)
web = FastAPI(title="web orders", lifespan=streamkit_lifespan(sk))


def _handled_key(order_id: str) -> str:
    return f"{PREFIX}:handled:{order_id}"


@sk.stream_listener(stream_prefix=PREFIX, group=GROUP)
async def fulfil(order: Order, msg: Message) -> None:
    # Recorded in Redis, so any process of the app (and the test) can see it.
    await sk.redis.set(_handled_key(order.order_id), f"{order.quantity}x {order.item}")
    await msg.ack()


@web.post("/orders", status_code=202)
async def place_order(order: Order) -> dict[str, str]:
    result = await orders.publish(order.order_id, order)
    return {"order_id": order.order_id, "entry": f"{result.stream_key}/{result.record_id}"}


@web.get("/orders/{order_id}")
async def order_status(order_id: str) -> dict[str, str]:
    handled = await sk.redis.get(_handled_key(order_id))
    if handled is None:
        raise HTTPException(404, f"order {order_id} not handled (yet)")
    text = handled.decode() if isinstance(handled, bytes) else str(handled)
    return {"order_id": order_id, "handled": text}
