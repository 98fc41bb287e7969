"""A small billing app, built by a factory so tests can point it at their own streams."""

from __future__ import annotations

from pydantic import BaseModel

from streamkit import StreamKit


class Order(BaseModel):
    order_id: str
    customer_id: str
    amount: int


class Invoice(BaseModel):
    order_id: str
    customer_id: str
    total: int


def build(app: StreamKit, *, orders: str, group: str, invoices: str) -> StreamKit:
    """Bill every order of ``orders`` (group ``group``) into ``invoices``."""
    app.stream(invoices, shards=2, groups=["mailing"])

    @app.stream_listener(stream_prefix=orders, group=group)
    @app.publisher(invoices, group="mailing", key=lambda invoice: invoice.customer_id)
    async def bill(order: Order) -> Invoice | None:
        if order.amount < 0:
            raise ValueError("negative amount")
        if order.amount == 0:
            return None  # nothing to bill
        return Invoice(order_id=order.order_id, customer_id=order.customer_id, total=order.amount)

    return app
