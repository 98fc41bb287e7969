"""Publishing on standalone Redis and on a 3-primary cluster: results, batches, fields."""

from __future__ import annotations

import enum
import json
from typing import Any

import pydantic
import pytest

from streamkit.publisher.publisher import (
    PublishBatchError,
    PublishResult,
    StaleRouteError,
    publish_result,
)
from streamkit.routing import shard_for_key, stream_key

from .conftest import Stack


async def test_publish_appends_to_the_routed_shard(stack: Stack) -> None:
    await stack.create_group(8)
    pub = stack.publisher()
    fields = {"s": "text", b"b": b"\x00\xff", "i": 42, "f": 1.5, "u": "한글"}
    result = await pub.publish("order-123", fields)
    assert result == PublishResult(
        stream_key=stream_key(stack.prefix, 5),  # SPEC vector: "order-123" -> 5 for n = 8
        shard_index=5,
        record_id=result.record_id,
        metadata_version=1,
    )
    entries = await stack.redis.xrange(result.stream_key)
    assert [(rid.decode(), data) for rid, data in entries] == [
        (
            result.record_id,
            {b"s": b"text", b"b": b"\x00\xff", b"i": b"42", b"f": b"1.5", b"u": "한글".encode()},
        )
    ]
    assert pub.published == 1 and pub.retries == 0 and pub.routing_failures == 0
    # bytes and str keys route alike
    assert (await pub.publish(b"order-123", {"x": 1})).shard_index == 5


async def test_publish_many_returns_results_in_input_order(stack: Stack) -> None:
    await stack.create_group(8)
    pub = stack.publisher()
    items = [(f"key-{i % 37}", {"seq": i}) for i in range(500)]
    results = await pub.publish_many(items)
    assert len(results) == 500
    for (key, _), result in zip(items, results, strict=True):
        assert result.shard_index == shard_for_key(key, 8)
        assert result.stream_key == stack.key(result.shard_index)
        assert result.metadata_version == 1
    # Each record id holds the message of the same input position, and per
    # shard the stream order is the input order.
    stored: dict[tuple[str, str], dict[bytes, bytes]] = {}
    for shard in range(8):
        entries = await stack.redis.xrange(stack.key(shard))
        seqs = [int(data[b"seq"]) for _, data in entries]
        assert seqs == sorted(seqs)
        stored.update({(stack.key(shard), rid.decode()): data for rid, data in entries})
    assert len(stored) == 500
    for i, result in enumerate(results):
        assert stored[result.stream_key, result.record_id] == {b"seq": str(i).encode()}
    assert pub.published == 500


async def test_publish_many_sends_large_inputs_in_batches(stack: Stack) -> None:
    await stack.create_group(3)
    pub = stack.publisher()
    pub.max_batch = 7
    results = await pub.publish_many((f"k{i}", {"i": i}) for i in range(50))  # any iterable
    assert [r.shard_index for r in results] == [shard_for_key(f"k{i}", 3) for i in range(50)]
    assert sum([await stack.redis.xlen(stack.key(s)) for s in range(3)]) == 50
    assert await pub.publish_many([]) == []


async def test_publish_many_reports_partial_failure(stack: Stack) -> None:
    pub = await stack.started_publisher(4)
    await stack.redis.delete(stack.key(2))  # a shard retired behind the coordinator's back
    keys = [f"user-{i}" for i in range(40)]
    with pytest.raises(PublishBatchError) as caught:
        await pub.publish_many([(k, {"k": k}) for k in keys])
    err = caught.value
    for i, key in enumerate(keys):
        if shard_for_key(key, 4) == 2:
            assert err.results[i] is None and isinstance(err.errors[i], StaleRouteError)
        else:
            result = err.results[i]
            assert result is not None and result.shard_index == shard_for_key(key, 4)
    assert await stack.redis.exists(stack.key(2)) == 0  # never recreated
    assert pub.published == len(keys) - len(err.errors)

    # Nothing published at all: the error itself, not a batch error.
    only_missing = [(k, {"k": k}) for k in keys if shard_for_key(k, 4) == 2]
    with pytest.raises(StaleRouteError):
        await pub.publish_many(only_missing)
    assert await stack.redis.exists(stack.key(2)) == 0


class Colour(enum.IntEnum):
    RED = 1


class Kind(enum.StrEnum):
    PAID = "paid"


@pytest.mark.parametrize(
    "value",
    [True, None, [1], {"a": 1}, (1,), bytearray(b"x"), object(), {1, 2}],
    ids=lambda v: type(v).__name__,
)
async def test_bad_field_values_are_rejected_before_sending(stack: Stack, value: Any) -> None:
    await stack.create_group(2)
    pub = stack.publisher()
    with pytest.raises(TypeError, match=r"field 'bad'.*use str, bytes, int or float"):
        await pub.publish("k", {"ok": "1", "bad": value})
    with pytest.raises(TypeError, match=r"message #2: field 'bad'"):
        await pub.publish_many([("a", {"x": 1}), ("b", {"x": 2}), ("c", {"bad": value})])
    assert [await stack.redis.xlen(stack.key(s)) for s in range(2)] == [0, 0]
    assert pub.published == 0


async def test_field_names_mappings_and_enums(stack: Stack) -> None:
    await stack.create_group(2)
    pub = stack.publisher()
    with pytest.raises(TypeError, match="field names must be str or bytes"):
        await pub.publish("k", {1: "x"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fields must be a mapping"):
        await pub.publish("k", [("a", "b")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not be empty"):
        await pub.publish("k", {})
    # Enum members are stored by value, not by repr().
    result = await pub.publish("k", {"colour": Colour.RED, "kind": Kind.PAID})
    ((_, data),) = await stack.redis.xrange(result.stream_key)
    assert data == {b"colour": b"1", b"kind": b"paid"}


class Order(pydantic.BaseModel):
    order_id: str
    amount: float


async def test_publish_json(stack: Stack) -> None:
    await stack.create_group(4)
    pub = stack.publisher()
    model = await pub.publish_json("o-1", Order(order_id="o-1", amount=9.5))
    plain = await pub.publish_json("o-1", {"order_id": "o-1", "note": "é"}, field="body")
    assert model.stream_key == plain.stream_key
    entries = await stack.redis.xrange(model.stream_key)
    assert json.loads(entries[0][1][b"payload"]) == {"order_id": "o-1", "amount": 9.5}
    assert json.loads(entries[1][1][b"body"]) == {"order_id": "o-1", "note": "é"}
    with pytest.raises(TypeError):
        await pub.publish_json("o-1", object())


async def test_maxlen_trims_approximately(stack: Stack) -> None:
    await stack.create_group(2)
    pub = stack.publisher(maxlen=50)
    key = "hot-key"
    await pub.publish_many([(key, {"i": i}) for i in range(2000)])
    length = await stack.redis.xlen(stack.key(shard_for_key(key, 2)))
    # "~": Redis trims whole macro nodes (100 entries by default), never below 50.
    assert 50 <= length <= 250


async def test_publisher_as_a_decorator_of_a_plain_function(stack: Stack) -> None:
    await stack.create_group(4)
    pub = stack.publisher()
    pub.key = lambda order: order.order_id

    @pub
    async def handle(order_id: str, amount: float | None) -> Order | None:
        return None if amount is None else Order(order_id=order_id, amount=amount)

    with pytest.warns(DeprecationWarning, match="publish_result is deprecated"):
        decorate = publish_result(pub, key=lambda fields: str(fields["id"]), as_fields=True)

    @decorate
    async def as_fields(i: int) -> list[dict[str, str | int]]:
        return [{"id": f"x{i}", "n": i}, {"id": "y", "n": 0}]

    assert await handle("o-9", 3.0) == Order(order_id="o-9", amount=3.0)
    assert await handle("o-9", None) is None  # nothing to publish
    assert await as_fields(7) == [{"id": "x7", "n": 7}, {"id": "y", "n": 0}]
    assert pub.published == 3
    ((_, data),) = await stack.redis.xrange(stack.key(shard_for_key("o-9", 4)))
    assert json.loads(data[b"payload"]) == {"order_id": "o-9", "amount": 3.0}
    ((_, data),) = await stack.redis.xrange(stack.key(shard_for_key("x7", 4)))
    assert data == {b"id": b"x7", b"n": b"7"}
