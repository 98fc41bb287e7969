"""One namespace, no collisions (issue 36, findings 6 and 7).

Shard keys (``{prefix}:{n}``), dead-letter keys (``{prefix}/dlq/{group}``) and the
coordinator's own keys (``{keyPrefix}:…``) are disjoint for every pair of valid
names: a property test over generated names, then the probe's two collisions
against a real coordinator, then the move of old dead-letter streams at start.
"""

from __future__ import annotations

import uuid

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server.sim import API, create_group, redis_of

from streamkit.consumer.failure import dead_letter_key, legacy_dead_letter_key
from streamkit.consumer.idempotence import Effects, fence_key, marker_key
from streamkit.routing import stream_key
from streamkit.scripts import slot_key
from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.errors import CoordinatorError
from streamkit_server.store import keys as k
from streamkit_server.store.provisioning import validate_consumer_group, validate_stream_prefix

# Names are drawn from a small alphabet rich in the characters that matter
# (separators, digits, the letters of "dlq" and of the key prefix).
_ALPHABET = st.sampled_from(list(":/dlqredis-stcoa0129_.{} %\x00\u2028"))
_RAW = st.text(_ALPHABET, min_size=1, max_size=24)


def _valid(check) -> st.SearchStrategy[str]:  # type: ignore[no-untyped-def]
    def ok(name: str) -> bool:
        try:
            check(name)
        except CoordinatorError:
            return False
        return True

    return _RAW.filter(ok)


PREFIXES = _valid(validate_stream_prefix) | st.sampled_from(
    ["col", "col:dlq", "redis-stream", "redis-stream:coord", "a:", "dlq", "x:dlq:0"]
)
GROUPS = _valid(validate_consumer_group) | st.sampled_from(["0", "12", "dlq", "g"])
KEY_PREFIXES = st.sampled_from([k.DEFAULT_KEY_PREFIX, "coord", "x:dlq", "a:b"])
SHARDS = st.integers(min_value=0, max_value=10**6)


def _coordinator_keys(kp: str, prefix: str, group: str, ident: str) -> list[str]:
    g = k.group_keys(kp, prefix, group)
    return [
        g.metadata, g.mutex, k.stream_record_key(kp, prefix), k.stream_lock_key(kp, prefix),
        k.index_key(kp), k.coordinators_key(kp), k.token_secret_key(kp),
        k.token_versions_key(kp), f"{k.ratelimit_prefix(kp)}:login-user:{ident}",
    ]  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(PREFIXES, GROUPS, PREFIXES, GROUPS, PREFIXES, SHARDS, KEY_PREFIXES, _RAW)
def test_key_schemes_are_disjoint(
    p1: str, g1: str, p2: str, g2: str, q: str, n: int, kp: str, ident: str
) -> None:
    streams = [p for p in (p1, p2, q) if not k.inside_key_prefix(kp, p)]
    dlq = {dead_letter_key(p, g) for p, g in ((p1, g1), (p2, g2)) if p in streams}
    shards = {stream_key(p, n) for p in streams}
    # A dead-letter key is never a shard key...
    assert not dlq & shards
    # ...nor another group's dead-letter key...
    if (p1, g1) != (p2, g2) and p1 in streams and p2 in streams:
        assert dead_letter_key(p1, g1) != dead_letter_key(p2, g2)
    # ...and neither enters the coordinator's namespace, where all its keys are.
    own = _coordinator_keys(kp, p1, g1, ident)
    assert all(key.startswith(f"{kp}:") for key in own)
    for key in dlq | shards:
        assert not key.startswith(f"{kp}:") and key not in own
    # The data plane's keys in a shard's slot (publish dedup record, handler
    # markers, fence, a user's effect key) are none of the above, and the
    # internal ones are distinct per shard and group.
    internal = {
        key
        for p, g in ((p1, g1), (p2, g2))
        if p in streams
        for shard in {stream_key(p, n)}
        for key in (
            slot_key(shard, "idem"), slot_key(shard, "idem:order"),
            marker_key(shard, g), fence_key(shard, g),
        )
    }  # fmt: skip
    assert not internal & (dlq | shards | set(own))
    if p1 in streams and p2 in streams and (p1, g1) != (p2, g2):
        s1, s2 = stream_key(p1, n), stream_key(p2, n)
        assert marker_key(s1, g1) != marker_key(s2, g2)
    if p1 in streams:
        effects = Effects(stream_key(p1, n), cluster=False)
        with pytest.raises(ValueError, match="reserved"):
            effects.key(random_reserved(ident))
        user = effects.key(f"n{ident}")  # a name that is not reserved
        assert user not in internal | dlq | shards | set(own)


def random_reserved(suffix: str) -> str:
    return "idem" if not suffix.strip() else f"done:{suffix}"


def test_the_old_scheme_collided() -> None:
    # The probe's finding, kept as a witness of what the property rules out.
    assert legacy_dead_letter_key("col", "0") == stream_key("col:dlq", 0)
    assert dead_letter_key("col", "0") != stream_key("col:dlq", 0)


async def test_stream_inside_the_key_prefix_is_refused(coordinator: CoordinatorProcess) -> None:
    async with httpx.AsyncClient(
        base_url=coordinator.url, auth=coordinator.admin_auth, timeout=10
    ) as http:
        for name in ("redis-stream:coord", "redis-stream:coord:ratelimit:login-user"):
            for path in (f"{API}/streams/{name}", f"{API}/streams/{name}/groups/g"):
                r = await http.post(path, json={"requestedBy": "t", "reason": "probe"})
                assert r.status_code == 400, r.text
                assert r.json()["errorCode"] == "INVALID_STREAM_PREFIX"
        # Outside the prefix is fine, even sharing its first segment.
        r = await http.post(
            f"{API}/streams/redis-stream-{uuid.uuid4().hex[:6]}",
            json={"requestedBy": "t", "reason": "probe"},
        )
        assert r.status_code == 201, r.text


async def test_dead_letters_never_read_another_streams_shard(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    col = f"col{uuid.uuid4().hex[:6]}"
    async with httpx.AsyncClient(base_url=coordinator.url, auth=coordinator.admin_auth,
                                 timeout=10) as http, redis_of(any_redis) as r:  # fmt: skip
        await create_group(http, coordinator, col, "0", 1)
        await create_group(http, coordinator, f"{col}:dlq", "g", 1)
        live = await r.xadd(stream_key(f"{col}:dlq", 0), {"orderId": "live"})
        page = (await http.get(f"{API}/monitoring/streams/{col}/groups/0/dead-letters")).json()
        assert page["deadLetterStream"] == f"{col}/dlq/0" and page["total"] == 0
        r2 = await http.post(
            f"{API}/streams/{col}/groups/0/dead-letters/{live}/replay",
            json={"requestedBy": "t", "reason": "probe"},
        )
        assert r2.status_code == 404 and r2.json()["errorCode"] == "DEAD_LETTER_NOT_FOUND"
        assert await r.xlen(stream_key(f"{col}:dlq", 0)) == 1


async def test_old_dead_letter_streams_move_at_start(
    coordinator: CoordinatorProcess,
    coordinator_factory,
    any_redis: RedisTarget,  # type: ignore[no-untyped-def]
) -> None:
    prefix = f"mv{uuid.uuid4().hex[:6]}"
    async with httpx.AsyncClient(base_url=coordinator.url, auth=coordinator.admin_auth,
                                 timeout=10) as http, redis_of(any_redis) as r:  # fmt: skip
        await create_group(http, coordinator, prefix, "billing", 1)
        await create_group(http, coordinator, prefix, "7", 1)
        await create_group(http, coordinator, f"{prefix}:dlq", "g", 8)
        old = legacy_dead_letter_key(prefix, "billing")
        ids = [await r.xadd(old, {"n": str(i), "x-group": "billing"}) for i in range(3)]
        # Group 7's old key is shard 7 of the stream "<prefix>:dlq": live, left alone.
        shard = await r.xadd(legacy_dead_letter_key(prefix, "7"), {"orderId": "live"})
        coordinator_factory(any_redis)  # a start moves what it finds
        new = dead_letter_key(prefix, "billing")
        assert [e[0] for e in await r.xrange(new)] == ids
        assert not await r.exists(old)
        assert [e[0] for e in await r.xrange(stream_key(f"{prefix}:dlq", 7))] == [shard]
        page = await http.get(f"{API}/monitoring/streams/{prefix}/groups/billing/dead-letters")
        assert page.json()["total"] == 3
