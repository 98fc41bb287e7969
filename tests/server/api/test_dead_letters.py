"""Listing and replaying a group's dead letters through the coordinator, over real HTTP.

The dead letters are written with the consumer's own ``dead_letter_fields``,
so they have exactly the shape a failing handler leaves behind.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx

from streamkit.consumer.failure import dead_letter_fields, dead_letter_key
from streamkit.routing import shard_for_key
from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from ..sim import API, create_group, redis_of


async def _dead_letter(r: Any, prefix: str, group: str, stream: str, fields: dict[str, str]) -> str:
    raw = {k.encode(): v.encode() for k, v in fields.items()}
    entry = dead_letter_fields(
        raw, stream_key=stream, entry_id="1700000000000-0", consumer_group=group, attempts=3,
        error="RuntimeError: boom",
    )  # fmt: skip
    return str(await r.xadd(dead_letter_key(prefix, group), entry))


async def test_list_page_and_replay(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    prefix, group = f"dl{uuid.uuid4().hex[:6]}", "g"
    listed = f"{API}/monitoring/streams/{prefix}/groups/{group}/dead-letters"
    replay = f"{API}/streams/{prefix}/groups/{group}/dead-letters"
    who = {"requestedBy": "tests", "reason": "fixed the handler"}
    async with httpx.AsyncClient(base_url=coordinator.url, auth=coordinator.admin_auth,
                                 timeout=10) as http, redis_of(any_redis) as r:  # fmt: skip
        await create_group(http, coordinator, prefix, group, 2)
        ids = [
            await _dead_letter(r, prefix, group, f"{prefix}:0", {"orderId": "o-1", "n": "0"}),
            await _dead_letter(r, prefix, group, f"{prefix}:1", {"orderId": "o-2", "n": "1"}),
            # From a shard that is not in the layout (a reshard happened since).
            await _dead_letter(r, prefix, group, f"{prefix}:7", {"orderId": "o-3", "n": "2"}),
            await _dead_letter(
                r,
                prefix,
                group,
                f"{prefix}:1",
                {"payload": json.dumps({"customer": "c-9"}), "n": "3"},
            ),
            # Claims to come from another stream: never written back there.
            await _dead_letter(r, prefix, group, "elsewhere:0", {"orderId": "o-5", "n": "4"}),
        ]

        # Pages of two, oldest first, until nextCursor is null.
        seen: list[dict[str, Any]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            page = (await http.get(listed, params=params)).json()
            assert page["total"] == 5 and page["deadLetterStream"] == f"{prefix}/dlq/{group}"
            seen += page["entries"]
            cursor = page["nextCursor"]
            if cursor is None:
                break
        assert [e["id"] for e in seen] == ids
        first = seen[0]
        assert first["originalStream"] == f"{prefix}:0" and first["attempts"] == 3
        assert first["error"] == "RuntimeError: boom" and first["group"] == group
        assert first["fields"] == {"orderId": "o-1", "n": "0"} and first["failedAt"] > 0

        # Back to its original shard: the original fields only, then gone from the DLQ.
        done = await http.post(f"{replay}/{ids[0]}/replay", json=who)
        assert done.status_code == 200, done.text
        assert done.json()["streamKey"] == f"{prefix}:0"
        (entry,) = await r.xrange(f"{prefix}:0", done.json()["recordId"], done.json()["recordId"])
        assert entry[1] == {"orderId": "o-1", "n": "0"}
        page = (await http.get(listed)).json()
        assert page["total"] == 4 and ids[0] not in [e["id"] for e in page["entries"]]

        # Its shard left the layout: refused until a partition key is named.
        for refused_id in (ids[2], ids[4]):
            refused = await http.post(f"{replay}/{refused_id}/replay", json=who)
            assert refused.status_code == 409, refused.text
            assert refused.json()["errorCode"] == "REPLAY_NEEDS_PARTITION_KEY"
        keyed = await http.post(f"{replay}/{ids[2]}/replay", json={**who, "keyField": "orderId"})
        assert keyed.status_code == 200, keyed.text
        assert keyed.json()["streamKey"] == f"{prefix}:{shard_for_key('o-3', 2)}"
        by_payload = await http.post(
            f"{replay}/{ids[3]}/replay", json={**who, "payloadKey": "customer"}
        )
        assert by_payload.json()["streamKey"] == f"{prefix}:{shard_for_key('c-9', 2)}"

        # The library's refusal (no such field) comes back as the API's error; nothing deleted.
        missing = await http.post(f"{replay}/{ids[1]}/replay", json={**who, "keyField": "nope"})
        assert missing.status_code == 422
        assert missing.json()["errorCode"] == "DEAD_LETTER_NOT_REPLAYED"
        assert "nope" in missing.json()["message"]
        page = (await http.get(listed)).json()
        assert [e["id"] for e in page["entries"]] == [ids[1], ids[4]]

        # An entry someone added by hand still lists (unknown numbers are 0).
        odd = await r.xadd(f"{prefix}/dlq/{group}", {"x-attempts": "many", "x-failed-at": "-"})
        (listed_odd,) = (await http.get(listed, params={"cursor": ids[4]})).json()["entries"]
        assert (listed_odd["id"], listed_odd["attempts"], listed_odd["failedAt"]) == (odd, 0, 0)

        # Bad input and unknown things: ErrorResponse, never 500.
        cases = [
            (await http.post(f"{replay}/{ids[2]}/replay", json=who), 404, "DEAD_LETTER_NOT_FOUND"),
            (await http.post(f"{replay}/abc/replay", json=who), 400, "INVALID_DEAD_LETTER_ID"),
            (await http.post(f"{replay}/{ids[1]}/replay", json={}), 400, "INVALID_REQUEST"),
            (
                await http.post(
                    f"{replay}/{ids[1]}/replay", json={**who, "keyField": "a", "payloadKey": "b"}
                ),
                400,
                "INVALID_REQUEST",
            ),
            (await http.get(listed, params={"cursor": "x"}), 400, "INVALID_CURSOR"),
            (await http.get(listed, params={"limit": 0}), 400, "INVALID_REQUEST"),
            (await http.get(listed.replace(f"/{group}/", "/nobody/")), 404, "GROUP_NOT_FOUND"),
        ]
        for answer, status, code in cases:
            assert (answer.status_code, answer.json()["errorCode"]) == (status, code), answer.text

    records = [json.loads(line.split("streamkit_server.audit: ", 1)[1])
               for line in coordinator.log_path.read_text().splitlines()
               if "streamkit_server.audit: " in line]  # fmt: skip
    replays = [r for r in records if r["action"] == "replayDeadLetter"
               and r["streamPrefix"] == prefix and r["kind"] == "mutation"]  # fmt: skip
    assert {r["status"] for r in replays} >= {200, 409, 422, 404}
    assert all(r["requestedBy"] == "tests" for r in replays if r["status"] == 200)
