"""Any payload type pydantic can validate: the shapes read at registration, the
annotations refused there, and dict / Order / list[Order] handlers over real Redis
with malformed entries dead-lettered naming the field."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict  # typing.TypedDict needs Python 3.12 for pydantic

from streamkit import Message, StreamKit
from streamkit.consumer.failure import dead_letter_key
from streamkit.consumer.handlers import inspect_handler
from streamkit.consumer.listener import ListenerConfigError

from .support import Admin, InProcessApp, dead_letters, eventually, serving


class Order(BaseModel):
    order_id: str
    amount: int


class OrderDict(TypedDict):
    order_id: str


@dataclasses.dataclass
class OrderData:
    order_id: str


class Opaque:
    """Nothing pydantic can build a schema for."""


async def takes_dict(payload: dict) -> None: ...  # type: ignore[type-arg]
async def takes_typed_dict(payload: OrderDict) -> None: ...
async def takes_dataclass(payload: OrderData) -> None: ...
async def takes_int(n: int) -> None: ...
async def takes_str(s: str) -> None: ...
async def takes_bytes(raw: bytes, msg: Message) -> None: ...
async def takes_union(x: Order | int) -> None: ...
async def takes_ints(xs: list[int]) -> None: ...
async def takes_opaque(thing: Opaque) -> None: ...
async def takes_unresolved(order: NotImportedHere) -> None: ...  # type: ignore[name-defined]  # noqa: F821


class _Msg:
    """Just enough of a Message for ``HandlerShape.decode``."""

    def __init__(self, raw: bytes) -> None:
        self.raw_fields = {b"payload": raw}
        self.id, self.stream_key = "1-0", "s:0"


@pytest.mark.parametrize(
    ("handler", "options", "raw", "value"),
    [
        (takes_dict, {}, b'{"a": 1}', {"a": 1}),
        (takes_typed_dict, {}, b'{"order_id": "o"}', {"order_id": "o"}),
        (takes_dataclass, {}, b'{"order_id": "o"}', OrderData("o")),
        (takes_int, {}, b"42", 42),
        (takes_str, {}, b'"hi"', "hi"),
        (takes_bytes, {}, b"\xff raw", b"\xff raw"),
        (takes_union, {}, b"7", 7),
        (takes_union, {}, b'{"order_id": "o", "amount": 1}', Order(order_id="o", amount=1)),
        (takes_ints, {"batch": False}, b"[1, 2]", [1, 2]),
    ],
)
def test_any_annotation_decodes_one_entry(
    handler: Any, options: dict[str, Any], raw: bytes, value: Any
) -> None:
    shape = inspect_handler(handler, **options)
    assert (not shape.batch and not shape.receives_messages) or handler is takes_bytes
    assert shape.decode(_Msg(raw), "payload") == value  # type: ignore[arg-type]


def test_a_list_annotation_is_a_batch_unless_batch_false() -> None:
    assert inspect_handler(takes_ints).batch
    assert inspect_handler(takes_ints).payload_type is int
    assert inspect_handler(takes_ints, batch=False).payload_type == list[int]


@pytest.mark.parametrize(
    ("handler", "match"),
    [
        (
            takes_opaque,
            r"handler takes_opaque of listener orders/billing: parameter 'thing': "
            r"cannot decode a payload into Opaque",
        ),
        (
            takes_unresolved,
            r"handler takes_unresolved .*parameter 'order': the annotation "
            r"'NotImportedHere' does not resolve",
        ),
    ],
)
def test_unserveable_annotations_are_refused_in_one_line(handler: Any, match: str) -> None:
    with pytest.raises(ListenerConfigError, match=match) as caught:
        StreamKit().stream_listener(stream_prefix="orders", group="billing")(handler)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_dict_order_and_batch_handlers_get_decoded_values(
    admin: Admin, redis: Any, names: tuple[str, str], make_app: InProcessApp
) -> None:
    prefix, group = names
    groups = {kind: f"{group}-{kind}" for kind in ("dict", "one", "batch")}
    for name in groups.values():
        await admin.create_group(prefix, name, 1)
    key = f"{prefix}:0"
    good = [b'{"order_id": "a", "amount": 1}', b'{"order_id": "b", "amount": 2}']
    for raw in [good[0], b'{"order_id": "c", "amount": "many"}', good[1], b"not json"]:
        await redis.xadd(key, {"payload": raw})
    got: dict[str, list[Any]] = {kind: [] for kind in groups}
    app = make_app("anypayload")

    @app.stream_listener(stream_prefix=prefix, group=groups["dict"])
    async def as_dict(payload: dict) -> None:  # type: ignore[type-arg]
        got["dict"].append(payload)  # no Message: acked when it returns

    @app.stream_listener(stream_prefix=prefix, group=groups["one"])
    async def as_order(order: Order) -> None:
        got["one"].append(order)

    @app.stream_listener(stream_prefix=prefix, group=groups["batch"])
    async def as_batch(orders: list[Order]) -> None:
        got["batch"].extend(orders)

    async def settled() -> bool:
        pending = [int((await redis.xpending(key, g))["pending"]) for g in groups.values()]
        letters = [int(await redis.xlen(dead_letter_key(prefix, g))) for g in groups.values()]
        return sum(map(len, got.values())) == 7 and pending == [0, 0, 0] and letters == [1, 2, 2]

    with anyio.fail_after(20):
        async with serving(app):
            await eventually(settled, 10, "every entry handled or dead-lettered")
    orders = [Order(order_id="a", amount=1), Order(order_id="b", amount=2)]
    assert got["one"] == orders and got["batch"] == orders
    assert [d["order_id"] for d in got["dict"]] == ["a", "c", "b"]
    (bad_json,) = await dead_letters(redis, dead_letter_key(prefix, groups["dict"]))
    assert bad_json["x-error"].startswith("PayloadError: invalid dict payload:")
    for kind in ("one", "batch"):
        many, not_json = await dead_letters(redis, dead_letter_key(prefix, groups[kind]))
        assert many["x-error"].startswith("PayloadError: invalid Order payload: amount: ")
        assert many["x-attempts"] == "1" and not_json["payload"] == "not json"
