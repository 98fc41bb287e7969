"""``model.replaced``: the core's copy is ``model_copy(update=...)``, cheaper.

The core copies the group, a member record and the request per heartbeat
with it; any difference from pydantic's copy (a field shared that should
not be, the fields set, the group's ownership index) would change what is
written or answered.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from streamkit.protocol import HeartbeatRequest, RuntimeConsumerCapacity, ShardId, shard_ids
from streamkit_server.core.model import GroupMetadata, MemberMetadata, new_group, replaced


def _state(model: BaseModel) -> tuple[Any, ...]:
    return (
        type(model),
        model.__dict__,
        model.__pydantic_fields_set__,
        model.__pydantic_extra__,
        model.__pydantic_private__,
    )


def _group() -> GroupMetadata:
    group = new_group("s", "g", 4, 1_000)
    group.members = {"m": MemberMetadata(member_id="m", assigned=[1], holding=[1])}
    group.owners = {1: "m"}
    group.target = {1: "m"}
    group.shards_held_by("m")  # builds the ownership index (a private attribute)
    return group


MODELS: list[BaseModel] = [
    _group(),
    MemberMetadata(member_id="m", member_epoch=7, progress={}),
    HeartbeatRequest(
        protocol_version=1,
        request_id="r",
        member_id="m",
        member_epoch=1,
        metadata_version=2,
        runtime_consumer_capacity=RuntimeConsumerCapacity(),
        owned_shards=shard_ids([1, 2]),
    ),
]
UPDATES: list[dict[str, Any]] = [{}, {"member_epoch": 9}, {"incarnation": "principal:x"}]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("update", UPDATES, ids=str)
def test_the_same_copy_as_model_copy(model: BaseModel, update: dict[str, Any]) -> None:
    update = {k: v for k, v in update.items() if k in type(model).model_fields}
    ours, theirs = replaced(model, **update), model.model_copy(update=update)
    assert _state(ours) == _state(theirs)
    assert ours == theirs
    # A new object with its own field dict, fields-set and private dict;
    # the field values themselves are shared, as model_copy shares them.
    assert ours is not model
    assert ours.__dict__ is not model.__dict__
    assert ours.__pydantic_fields_set__ is not model.__pydantic_fields_set__
    if model.__pydantic_private__ is not None:
        assert ours.__pydantic_private__ is not model.__pydantic_private__
    for name, value in model.__dict__.items():
        if name not in update:
            assert ours.__dict__[name] is value


def test_the_group_copy_keeps_its_index_until_a_map_changes() -> None:
    group = _group()
    copied = replaced(group)
    assert copied.__pydantic_private__ == group.__pydantic_private__
    copied.owners = {**copied.owners, 2: "m"}
    assert copied.shards_held_by("m") == [1, 2]
    assert group.shards_held_by("m") == [1]


def test_shard_ids_share_frozen_shards() -> None:
    first, again = shard_ids([3, 1, 3]), shard_ids([1, 3])
    assert first == again == [ShardId(shard_index=1), ShardId(shard_index=3)]
    assert first is not again  # a new list each time: a caller may change its own
    assert all(a is b for a, b in zip(first, again, strict=True))
    with pytest.raises(ValueError):
        shard_ids([-1])
    with pytest.raises(ValueError):
        shard_ids([True])  # refused, not found as shard 1
