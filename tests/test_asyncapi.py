"""``streamkit docs``: the AsyncAPI 3.0 document of an app, validated against the
official JSON Schema (``tests/data/asyncapi-3.0.0.json``, from npm ``@asyncapi/specs``)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from streamkit import FailurePolicy, Message, StreamKit
from streamkit.asyncapi import asyncapi_document
from streamkit.asyncapi_html import render_html

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "tests" / "data" / "asyncapi-3.0.0.json").read_text())


def errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]


class Order(BaseModel):
    order_id: str
    customer_id: str
    amount: int


class Invoice(BaseModel):
    order_id: str
    lines: list[Line]


class Line(BaseModel):
    sku: str
    quantity: int = 1


@dataclasses.dataclass
class Refund:
    order_id: str


def rich_app() -> StreamKit:
    app = StreamKit()
    app.stream("orders", shards=8)
    invoices = app.publisher(
        "invoices", group="mailing", key=lambda inv: inv.order_id, maxlen=10_000
    )

    @app.stream_listener(
        stream_prefix="orders",
        group="billing",
        concurrency=3,
        ordered=False,
        failure_policy=FailurePolicy(max_attempts=3, on_exhausted="halt"),
    )
    @invoices
    async def bill(order: Order) -> Invoice | None:
        return None

    @app.stream_listener(stream_prefix="orders", group="stats")
    async def count(orders: list[Order]) -> None: ...

    @app.stream_listener(stream_prefix="orders", group="raw")
    async def raw(msg: Message) -> None: ...

    @app.stream_listener(stream_prefix="refunds", group="audit")
    async def audit(refund: Refund | dict[str, int]) -> None: ...

    @app.stream_listener(stream_prefix="blobs", group="archive")
    async def archive(blob: bytes) -> None: ...

    return app


def test_the_document_validates_and_says_what_the_app_declares() -> None:
    document = asyncapi_document(rich_app(), title="billing", version="1.2.3")
    assert errors(document) == []
    orders = document["channels"]["orders"]
    assert orders["address"] == "orders:{shard}" and orders["x-streamkit-shards"] == 8
    assert set(orders["messages"]) == {"Order", "RawEntry"}
    invoices = document["channels"]["invoices"]
    assert invoices["x-streamkit-partition-keys"] == ["lambda inv: inv.order_id"]
    assert invoices["x-streamkit-maxlen"] == 10_000 and invoices["x-streamkit-shards"] is None
    operations = document["operations"]
    bill = operations["receive-bill"]
    assert (bill["x-streamkit-group"], bill["x-streamkit-concurrency"]) == ("billing", 3)
    assert bill["x-streamkit-ordered"] is False
    assert bill["x-streamkit-failure-policy"]["onExhausted"] == "halt"
    assert operations["receive-count"]["x-streamkit-batch"] is True
    send = operations["send-invoices-bill"]
    assert send["action"] == "send" and send["messages"] == [
        {"$ref": "#/channels/invoices/messages/Invoice"}
    ]
    schemas = document["components"]["schemas"]
    assert {"Order", "Invoice", "Line"} <= set(schemas)  # nested models too
    assert schemas["Invoice"]["properties"]["lines"]["items"] == {
        "$ref": "#/components/schemas/Line"
    }
    messages = document["components"]["messages"]
    assert messages["bytes"]["payload"] == {"type": "string", "format": "binary"}
    assert "Refund" in json.dumps(messages)


def test_the_validator_is_not_vacuous() -> None:
    document = asyncapi_document(rich_app())
    document["operations"]["receive-raw"]["action"] = "consume"
    del document["channels"]["orders"]["address"]
    document["channels"]["orders"]["messages"]["Order"] = {"payload": 3}
    assert len(errors(document)) >= 2


def test_the_page_shows_streams_operations_and_payloads() -> None:
    page = render_html(asyncapi_document(rich_app(), title="<billing>"))
    assert "&lt;billing&gt;" in page and "<billing>" not in page  # escaped
    for text in ("Stream <code>orders</code>", "receive", "send", "customer_id", "lambda inv"):
        assert text in page


def test_the_command_writes_the_samples_document(tmp_path: Path) -> None:
    out, page = tmp_path / "orders.json", tmp_path / "orders.html"
    result = subprocess.run(
        [sys.executable, "-m", "streamkit", "docs", "samples.orders.app:app",
         "-o", str(out), "--html", str(page)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    assert errors(document) == []
    assert document["channels"]["orders"]["x-streamkit-shards"] == 8
    assert "Order" in document["components"]["schemas"] and "order_id" in page.read_text()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["nosuch:app"], "cannot import module 'nosuch'"),
        (["samples.orders.app:app", "-o", "/nonexistent/dir/x.json"], "cannot write"),
    ],
)
def test_the_command_fails_in_one_line(args: list[str], fragment: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "streamkit", "docs", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and fragment in line
