"""A StreamKit app for the subprocess tests: orders in, invoices out through a
stacked ``@app.publisher`` (``SKT_PREFIX``/``SKT_GROUP`` the orders, ``SKT_INVOICES``
the invoice stream, ``SKT_SLEEP_MS`` per order)."""

from __future__ import annotations

import os

import anyio

from streamkit import StreamKit

from .orders import Invoice, Order, invoice_for

sleep_s = float(os.environ.get("SKT_SLEEP_MS", "0")) / 1000
app = StreamKit()


@app.stream_listener(stream_prefix=os.environ["SKT_PREFIX"], group=os.environ["SKT_GROUP"])
@app.publisher(os.environ["SKT_INVOICES"], group="mailing", key=lambda inv: inv.customer_id)
async def bill(order: Order) -> Invoice:
    if sleep_s:
        await anyio.sleep(sleep_s)
    return invoice_for(order)
