"""Store layout v1 -> v2: upgraded in place by a v2 coordinator, refused by a v1 one.

The v1 side is the frozen v1 store in ``v1_store.py`` (that version's Lua,
unchanged), run against a real v2 coordinator process on the same Redis.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from streamkit.protocol import HeartbeatRequest, RuntimeConsumerCapacity, shard_ids
from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.core import CoordinatorConfig, handle_heartbeat, new_group

from ..sim import SimMember, create_group, meta_key, redis_of, shards, snapshot
from .v1_store import V1Store, V1Unsupported

Factory = Callable[..., CoordinatorProcess]
SLOW = {"heartbeat_interval_ms": 500, "member_lease_ttl_ms": 30_000}


def _beat(member_id: str, epoch: int, owned: list[int], version: int) -> HeartbeatRequest:
    return HeartbeatRequest(
        protocol_version=1,
        request_id="v1",
        member_id=member_id,
        member_epoch=epoch,
        metadata_version=version,
        runtime_consumer_capacity=RuntimeConsumerCapacity(
            runtime_max_concurrency=1, available_concurrency=1
        ),
        owned_shards=shard_ids(owned),
    )


async def test_v2_coordinator_upgrades_a_v1_group_in_place_and_keeps_its_state(
    coordinator_factory: Factory, any_redis: RedisTarget
) -> None:
    # A lease long enough that a loaded machine cannot expire m1 between the
    # v1 write and the v2 heartbeat: the test is about the layout, not leases.
    coordinator = coordinator_factory(any_redis, **SLOW)
    # The v1 coordinator's history: m1 joined and was granted every shard.
    now = time.time_ns() // 1_000_000
    config = CoordinatorConfig(heartbeat_interval_ms=500, member_lease_ttl_ms=30_000)
    group = new_group("upg", "g", 4, now)
    joined = handle_heartbeat(group, "m1", _beat("m1", 0, [], 0), now, config)
    assert joined.state is not None and joined.response.member_epoch
    epoch = joined.response.member_epoch
    version = joined.state.metadata_version
    owned = [s.shard_index for s in joined.response.assignment.assigned_shards]  # type: ignore[union-attr]
    assert owned == [0, 1, 2, 3]
    async with httpx.AsyncClient() as http, redis_of(any_redis) as r:
        v1 = V1Store(r)
        aggregate = joined.state.model_dump_json(by_alias=True)
        assert await v1.commit("upg", "g", aggregate, None, "v1-token")
        assert (await r.hget(meta_key("upg", "g"), "layoutVersion")) == "1"

        m1 = SimMember(http, coordinator.url, "upg", "g", "m1")
        m1.epoch, m1.version, m1.owned = epoch, version, set(owned)
        view = await m1.heartbeat()
        # Nothing was lost in the upgrade: same member, same epoch, same shards.
        assert view["status"] == "OK", view
        assert view["memberEpoch"] == epoch
        assert shards(view) == owned

        stored = await snapshot(r, "upg", "g")
        assert stored["layoutVersion"] == "2"
        assert "aggregate" not in stored
        assert {"group", "m:m1"} <= stored.keys()
        assert int(stored["revision"]) == 2  # one write on top of the v1 revision

        # From now on an older coordinator must keep its hands off.
        with pytest.raises(V1Unsupported, match="layoutVersion=2"):
            await v1.load("upg", "g", "v1-token")


async def test_v1_coordinator_refuses_a_v2_group_and_leaves_it_untouched(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    async with httpx.AsyncClient() as http, redis_of(any_redis) as r:
        await create_group(http, coordinator, "v2only", "g", 4)
        m1 = SimMember(http, coordinator.url, "v2only", "g", "m1")
        await m1.heartbeat()
        await m1.heartbeat()
        assert m1.owned == {0, 1, 2, 3}
        before = await snapshot(r, "v2only", "g")

        v1 = V1Store(r)
        with pytest.raises(V1Unsupported, match="layoutVersion=2"):
            await v1.load("v2only", "g", "v1-token")
        # It never got as far as a write, and gave its mutex back.
        assert await snapshot(r, "v2only", "g") == before
        assert not await r.exists(meta_key("v2only", "g").replace(":metadata", ":mutex"))
        # A v1 create (CAS on an absent key) cannot overwrite it either.
        assert not await v1.commit("v2only", "g", "{}", None, "v1-token")
        assert await snapshot(r, "v2only", "g") == before
        # The v2 coordinator carries on.
        assert (await m1.heartbeat())["status"] == "OK"


#: The last commit with store layout 1 (its coordinator is the "v1" process).
V1_COMMIT = "f6f29ab"


@pytest.fixture
def v1_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The previous commit's packages in ``tmp_path/v1``; the working directory is
    moved to ``tmp_path``, since ``python -m`` puts it first on sys.path."""
    repo = Path(__file__).resolve().parents[3]
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", V1_COMMIT, "streamkit", "streamkit_server"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    target = tmp_path / "v1"
    target.mkdir()
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    monkeypatch.chdir(tmp_path)
    return target


@pytest.mark.long
async def test_real_v1_coordinator_process_and_v2_process_on_one_redis(
    v1_checkout: Path, coordinator_factory: Factory, any_redis: RedisTarget
) -> None:
    """Both directions with the previous commit's coordinator running as a process.

    Needs the git history (``git archive``); kept out of CI with the ``long``
    marker, the frozen-store tests above cover the same ground there.
    """
    v1 = coordinator_factory(any_redis, env={"PYTHONPATH": str(v1_checkout)}, **SLOW)
    v2 = coordinator_factory(any_redis, **SLOW)
    async with httpx.AsyncClient() as http, redis_of(any_redis) as r:
        await create_group(http, v1, "real", "g", 4)
        m1 = SimMember(http, v1.url, "real", "g", "m1")
        await m1.heartbeat()
        await m1.heartbeat()
        assert m1.owned == {0, 1, 2, 3}
        assert await r.hget(meta_key("real", "g"), "layoutVersion") == "1"
        view = await m1.heartbeat(base_url=v2.url)  # v2 upgrades it in place
        assert view["status"] == "OK" and shards(view) == [0, 1, 2, 3]
        assert await r.hget(meta_key("real", "g"), "layoutVersion") == "2"
        before = await snapshot(r, "real", "g")
        refused = await m1.post(m1.body(), base_url=v1.url)
        assert refused.status_code == 503
        assert refused.json()["errorCode"] == "METADATA_SCHEMA_UNSUPPORTED"
        assert await snapshot(r, "real", "g") == before
