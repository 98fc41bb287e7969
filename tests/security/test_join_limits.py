"""Over real HTTP: joins are rate limited per principal.

Departed records no longer block joins, so the cost left to a credential
that joins under fresh member ids in a loop is the rebalance each join
causes: ``JOINS_PER_MINUTE`` bounds it per principal, without touching
other principals or the heartbeats of members already joined."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from helpers import create_group
from two_principals import API, A, B, heartbeat, start

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess

LIMIT = 3


def _hb(member: str, epoch: int, **extra: Any) -> dict[str, Any]:
    return heartbeat(member, epoch, incarnation=f"inc-{member}", **extra)


async def test_a_loop_of_joins_is_limited_per_principal(
    private_redis_server: RedisServer, coordinator_factory: Callable[..., CoordinatorProcess]
) -> None:
    coord = start(
        private_redis_server, coordinator_factory, STREAMKIT_SERVER_JOINS_PER_MINUTE=str(LIMIT)
    )
    a, b = A, B
    group = f"{API}/streams/joins/groups/g"
    async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
        await create_group(coord, "joins", "g", 2, http=http)

        def url(member: str) -> str:
            return f"{group}/members/{member}/heartbeat"

        epochs = {}
        for i in range(LIMIT):
            joined = await http.post(url(f"a-{i}"), json=_hb(f"a-{i}", 0), auth=a)
            assert joined.status_code == 200, joined.text
            epochs[f"a-{i}"] = joined.json()["memberEpoch"]

        refused = await http.post(url("a-x"), json=_hb("a-x", 0), auth=a)
        assert refused.status_code == 429, refused.text
        body = refused.json()
        assert body["errorCode"] == "TOO_MANY_REQUESTS" and body["status"] == "429"
        assert 1 <= int(refused.headers["retry-after"]) <= 60

        # Another principal joins; a member already joined heartbeats on.
        other = await http.post(url("b-0"), json=_hb("b-0", 0), auth=b)
        assert other.status_code == 200, other.text
        steady = await http.post(url("a-0"), json=_hb("a-0", epochs["a-0"]), auth=a)
        assert steady.status_code == 200, steady.text

        members = await http.get(
            f"{API}/monitoring/streams/joins/groups/g/members", auth=coord.admin_auth
        )
        ids = sorted(m["memberId"] for m in members.json()["members"])
        assert ids == ["a-0", "a-1", "a-2", "b-0"]  # the refused join wrote nothing
