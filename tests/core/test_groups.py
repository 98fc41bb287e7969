"""Group lifecycle and stream-record rules, as pure functions."""

from __future__ import annotations

import pytest

from streamkit_server.core import (
    GroupMetadata,
    create_group,
    delete_group,
    invariant_violations,
    new_group,
)
from streamkit_server.core.errors import Rejected
from streamkit_server.core.retention import RetentionPolicy
from streamkit_server.core.streams import (
    StreamRecord,
    create_group_layout,
    record_with_group,
    record_without_group,
    synced_record,
)

from .harness import Harness, request


def _code(call: object) -> str:
    with pytest.raises(Rejected) as refused:
        call()  # type: ignore[operator]
    return refused.value.error_code


def test_create_refuses_an_existing_group_and_starts_on_the_stream_layout() -> None:
    result = create_group(None, "s", "g", [3, 1], now_ms=5)
    created = result.state
    assert isinstance(created, GroupMetadata) and created.layout == [3, 1]
    assert result.response is created and not invariant_violations(created)
    assert _code(lambda: create_group(created, "s", "g", [0], now_ms=6)) == "GROUP_ALREADY_EXISTS"


def test_delete_refuses_a_missing_or_live_group_unless_forced() -> None:
    assert _code(lambda: delete_group(None, "s", "g", force=False)) == "GROUP_NOT_FOUND"
    h = Harness(group=new_group("s", "g", 2, 0))
    h.beat("a", request("a", 0))
    live = h.group
    assert _code(lambda: delete_group(live, "s", "g", force=False)) == "GROUP_NOT_INACTIVE"
    gone = delete_group(live, "s", "g", force=True)
    assert gone.state is None and gone.response is live


def test_a_new_group_joins_the_stream_layout_or_is_refused() -> None:
    record = StreamRecord((4, 5), "key", ("other",))
    assert create_group_layout("s", record, [], None, 8, None) == ([4, 5], False)
    assert create_group_layout("s", None, [], None, 8, None) == (list(range(8)), True)
    assert create_group_layout("s", None, [], 3, 8, "key") == ([0, 1, 2], True)
    mismatch = lambda: create_group_layout("s", record, [], 3, 8, None)  # noqa: E731
    assert _code(mismatch) == "SHARD_COUNT_MISMATCH"
    ordering = lambda: create_group_layout("s", record, [], None, 8, "none")  # noqa: E731
    assert _code(ordering) == "ORDERING_MISMATCH"
    a, b = new_group("s", "a", 2, 0), new_group("s", "b", 3, 0)
    assert _code(lambda: create_group_layout("s", None, [a, b], None, 8, None)) == "LAYOUT_DIVERGED"


def test_the_record_names_its_groups_and_follows_their_layout() -> None:
    record = record_with_group(None, [0, 1], "key", "g")
    assert record == StreamRecord((0, 1), "key", ("g",))
    assert record_without_group(record, "other") is None
    assert record_without_group(record, "g") == StreamRecord((0, 1), "key", ())
    group = new_group("s", "g", 3, 0)
    assert synced_record("s", [group], record) == StreamRecord((0, 1, 2), "key", ("g",))
    assert synced_record("s", [], record) is None


def test_the_record_keeps_its_retention_and_a_create_may_set_it() -> None:
    week = RetentionPolicy(max_age_ms=7 * 86_400_000)
    record = record_with_group(None, [0, 1], None, "g", week)
    assert record.retention == week
    assert record_with_group(record, [0, 1], None, "h").retention == week
    short = RetentionPolicy(max_length=10)
    assert record_with_group(record, [0, 1], None, "h", short).retention == short
    assert synced_record("s", [new_group("s", "g", 3, 0)], record).retention == week  # type: ignore[union-attr]
    fields = {**record.layout_fields(), **record.groups_field(), **record.retention_field()}
    assert StreamRecord.parse(fields, "s") == record
    # Records written before retention existed: no retention of their own.
    old = {**record.layout_fields(), **record.groups_field()}
    assert StreamRecord.parse(old, "s").retention is None
    bad = {**old, "retention": '{"maxAgeMs": -1}'}
    with pytest.raises(Rejected):
        StreamRecord.parse(bad, "s")
