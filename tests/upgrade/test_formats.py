"""Shared formats read across releases: what N accepts from N-1 and from N+1.

The inventory is docs/operations.md, "Upgrades and rollbacks"; the processes
of two releases on one Redis are tests/upgrade/test_rolling_upgrade.py.
"""

from __future__ import annotations

import pytest
import redis.asyncio

from streamkit.consumer.dead_letter import DeadLetter
from streamkit.consumer.failure import dead_letter_fields
from streamkit_server.coordination.timings import (
    LIVE_MS,
    TimingConflict,
    Timings,
    coordinators_key,
    encode,
)
from streamkit_server.core import CoordinatorConfig, MemberMetadata

PREFIX = "redis-stream:coord"
CONFIG = CoordinatorConfig(heartbeat_interval_ms=200, member_lease_ttl_ms=1_500)


async def _entry(client: redis.asyncio.Redis, coordinator: str, timings: str) -> None:
    seconds, micros = await client.time()
    bound = seconds * 1000 + micros // 1000 + LIVE_MS
    await client.hset(coordinators_key(PREFIX), coordinator, f"{bound}|{timings}")


@pytest.mark.parametrize(
    ("theirs", "agrees"),
    [
        (encode(CONFIG), True),  # the previous release writes the same settings
        (encode(CONFIG) + ",claimIdleMs=500", True),  # a later release adds one
        ("claimIdleMs=500," + encode(CONFIG), True),  # in any order
        (encode(CoordinatorConfig(heartbeat_interval_ms=300, member_lease_ttl_ms=1_500)), False),
        (encode(CoordinatorConfig(heartbeat_interval_ms=300)) + ",claimIdleMs=500", False),
        ("claimIdleMs=500", False),  # nothing in common: not proof of agreement
        ("", False),
    ],
)
async def test_registry_compares_the_settings_both_entries_name(
    redis_url: str, theirs: str, agrees: bool
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await _entry(client, "coord-other", theirs)
        mine = Timings(client, PREFIX, "coord-mine", CONFIG)
        if agrees:
            await mine.register()
            assert b"coord-mine" in await client.hgetall(coordinators_key(PREFIX))
        else:
            with pytest.raises(TimingConflict, match="coord-other"):
                await mine.register()
    finally:
        await client.aclose()


def test_member_records_without_and_with_fields_this_release_does_not_write() -> None:
    # The previous release's record has no epochVersion: read as 0, which
    # turns the lost-history version check off for that epoch, as before.
    old = MemberMetadata.model_validate_json('{"memberId":"m","memberEpoch":7}')
    assert (old.member_epoch, old.epoch_version) == (7, 0)
    # A later release's field is ignored (and dropped when this one rewrites it).
    new = MemberMetadata.model_validate_json('{"memberId":"m","memberEpoch":7,"laterField":[1]}')
    assert new.member_epoch == 7 and "laterField" not in new.model_dump_json(by_alias=True)


def test_dead_letter_metadata_of_a_later_release_stays_out_of_a_replay() -> None:
    letter = DeadLetter(
        "1-0",
        {b"order": b"42", b"x-group": b"g", b"x-attempts": b"3", b"x-streamkit-format": b"2"},
    )
    assert letter.original == {b"order": b"42"}
    # Dead-lettered again here: fresh metadata, the later release's field not carried on.
    again = dead_letter_fields(
        letter.fields, stream_key="s:0", entry_id="1-0", consumer_group="g", attempts=1, error="e"
    )
    assert b"x-streamkit-format" not in again and again[b"order"] == b"42"
