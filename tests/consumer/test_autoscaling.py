"""The autoscaling signal driven the way KEDA's ``metrics-api`` scaler reads it.

A real app whose handlers stall: the backlog grows with every publish, the
recommendation rises and stops at ``ceil(shards / concurrency)``; once the
handlers are released and the backlog clears, it falls.  The same run shows
the per-shard and per-member series on ``/metrics``.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import httpx
import pytest

from streamkit import Message
from streamkit.testing.coordinator import CoordinatorProcess

from .support import Admin, InProcessApp, eventually, serving

pytestmark = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)

SHARDS, CONCURRENCY, TARGET_LAG = 8, 2, 10
CAP = -(-SHARDS // CONCURRENCY)  # 4


def scaler_url(coordinator: CoordinatorProcess, prefix: str, group: str) -> str:
    """The URL a ScaledObject's metrics-api trigger holds (docs/operations.md)."""
    return (
        f"{coordinator.url}/coord/v1/monitoring/streams/{prefix}/groups/{group}/autoscaling"
        f"?concurrency={CONCURRENCY}&targetLag={TARGET_LAG}"
    )


async def test_stalled_group_scales_up_to_the_cap_and_down_after_the_backlog(
    admin: Admin, redis: Any, names: tuple[str, str], make_app: InProcessApp,
    coordinator: CoordinatorProcess,
) -> None:  # fmt: skip
    prefix, group = names
    await admin.create_group(prefix, group, SHARDS)
    release = anyio.Event()

    async def stalled(msg: Message) -> None:
        await release.wait()
        await msg.ack()

    app = make_app("scaler")
    app.add_listener(prefix, group, stalled, concurrency=CONCURRENCY, batch_size=5)
    url = scaler_url(coordinator, prefix, group)
    published = 0

    async def publish(count: int) -> None:
        nonlocal published
        for _ in range(count):
            await redis.xadd(f"{prefix}:{published % SHARDS}", {"n": str(published)})
            published += 1

    async with httpx.AsyncClient(timeout=10, auth=coordinator.admin_auth) as http:

        async def poll() -> dict[str, Any]:
            answer = await http.get(url)
            assert answer.status_code == 200, answer.text
            body: dict[str, Any] = answer.json()
            return body

        async with serving(app):
            await eventually(
                lambda: len(app.members) == CONCURRENCY
                and all(m.machine.joined for m in app.members),
                within=10, what="the members joined",
            )  # fmt: skip
            idle = await poll()
            assert idle["recommendedReplicas"] == 0 and idle["backlog"] == 0
            assert idle["maxUsefulReplicas"] == CAP and idle["shardCount"] == SHARDS
            seen: list[int] = []
            backlogs: list[int] = []
            for wave in (5, 10, 20, 120):
                await publish(wave)
                # KEDA polls; the backlog it sees is every entry published so far.
                body = await poll()
                assert body["backlog"] == published, body
                assert body["totalLag"] + body["totalPending"] == body["backlog"]
                assert sum((s["lag"] or 0) + s["pending"] for s in body["shards"]) == published
                backlogs.append(body["backlog"])
                seen.append(body["recommendedReplicas"])
            assert backlogs == sorted(backlogs) and len(set(backlogs)) == len(backlogs)
            # ceil(backlog / target lag): 5 -> 1, 15 -> 2, 35 -> 4, 155 -> 16, capped at 4
            assert seen == [1, 2, CAP, CAP], seen
            assert (await poll())["totalPending"] > 0  # the stalled handlers hold entries

            # The per-shard and per-member series of this running group.
            text = (await http.get(f"{coordinator.url}/metrics")).text
            labels = f'consumer_group="{group}",shard="0",stream_prefix="{prefix}"'
            assert re.search(rf"redis_stream_coord_shard_lag\{{{labels}\}} \d", text)
            assert re.search(rf"redis_stream_coord_shard_pending\{{{labels}\}} \d", text)
            assert f'redis_stream_coord_shard_owner_state{{consumer_group="{group}"' in text
            for member in app.members:
                for family in ("last_heartbeat_age_seconds", "lease_remaining_seconds",
                               "revoking_shards"):  # fmt: skip
                    assert re.search(
                        rf'redis_stream_coord_member_{family}\{{consumer_group="{group}",'
                        rf'member_id="{re.escape(member.member_id)}"', text
                    ), (family, member.member_id)  # fmt: skip
            assert re.search(
                rf'redis_stream_coord_group_lag\{{consumer_group="{group}",'
                rf'stream_prefix="{prefix}"\}} \d', text
            )  # fmt: skip

            release.set()

            async def cleared() -> bool:
                return (await poll())["backlog"] == 0

            await eventually(cleared, within=20, what="the backlog cleared")
            done = await poll()
            # Falls to one process: the group handled entries within the window,
            # so it is kept (scaled to zero only once it idles a whole window).
            assert done["recommendedReplicas"] == 1, done
            assert done["handledPerSecond"] > 0, done


@pytest.mark.parametrize(
    "query",
    [
        "concurrency=0&targetLag=10",
        "concurrency=2&targetLag=0",
        "concurrency=x&targetLag=10",
        "concurrency=2",
        "targetLag=10",
        "concurrency=99999&targetLag=10",
        "concurrency=2&targetLag=1e3",
    ],
)
async def test_bad_parameters_are_400_error_responses(
    admin: Admin, names: tuple[str, str], coordinator: CoordinatorProcess, query: str
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    path = f"/coord/v1/monitoring/streams/{prefix}/groups/{group}/autoscaling?{query}"
    async with httpx.AsyncClient(timeout=10, auth=coordinator.admin_auth) as http:
        answer = await http.get(f"{coordinator.url}{path}")
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["status"] == "400" and body["errorCode"] == "INVALID_REQUEST" and body["message"]


async def test_unknown_group_and_bad_names(
    coordinator: CoordinatorProcess, names: tuple[str, str]
) -> None:
    prefix, _ = names
    base = f"{coordinator.url}/coord/v1/monitoring/streams"
    async with httpx.AsyncClient(timeout=10, auth=coordinator.admin_auth) as http:
        missing = await http.get(
            f"{base}/{prefix}/groups/nobody/autoscaling?concurrency=1&targetLag=1"
        )
        assert missing.status_code == 404 and missing.json()["errorCode"] == "GROUP_NOT_FOUND"
        bad = await http.get(f"{base}/{'x' * 300}/groups/g/autoscaling?concurrency=1&targetLag=1")
        assert bad.status_code == 400 and bad.json()["status"] == "400"
        anonymous = await http.get(
            f"{base}/{prefix}/groups/g/autoscaling?concurrency=1&targetLag=1", auth=None
        )
        assert anonymous.status_code == 401
