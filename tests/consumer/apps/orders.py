"""The order and invoice models of the invoicing app and its tests."""

from __future__ import annotations

from pydantic import BaseModel


class Order(BaseModel):
    order_id: str
    customer_id: str
    amount: int


class Invoice(BaseModel):
    order_id: str
    customer_id: str
    total: int


def invoice_for(order: Order) -> Invoice:
    return Invoice(order_id=order.order_id, customer_id=order.customer_id, total=order.amount)
