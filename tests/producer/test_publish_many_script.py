"""Property tests of the batched check-and-append (``IDEMPOTENT_XADD_MANY``)
against a real Redis: random batches of ids (repeats inside a batch and
across batches), mixed with one-entry calls (``IDEMPOTENT_XADD``) that share
the dedup record, and calls whose reply is lost (the publisher sends the
same call again), checked after every step against a model.

What must hold: every id is appended exactly once (no duplicate, no loss);
every reply for an id names its first entry and says whether it was a
repeat; a call on a missing stream appends nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamkit.publisher.idempotence import PublishIdempotence, appended
from streamkit.scripts import IDEMPOTENT_XADD, IDEMPOTENT_XADD_MANY, slot_key
from streamkit.testing import RedisServer, RedisTarget, redis_client

IDEM = PublishIdempotence(window=3600, max_ids=10_000, producer_id="p")

steps_strategy = st.lists(
    st.tuples(
        st.sampled_from(["many", "one"]),
        st.lists(st.integers(0, 12), min_size=1, max_size=8),  # ids of the call
        st.booleans(),  # its reply is lost: the same call is sent again
    ),
    max_size=20,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=steps_strategy)
def test_batched_check_and_append_appends_each_id_once(
    redis_server: RedisServer, steps: list[Any]
) -> None:
    with redis.Redis.from_url(redis_server.url) as r:
        run(r, steps)


def run(r: redis.Redis, steps: list[Any]) -> None:
    stream = f"pm-{uuid.uuid4().hex[:8]}:0"
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    r.script_load(IDEMPOTENT_XADD.source)
    r.script_load(IDEMPOTENT_XADD_MANY.source)
    first: dict[str, bytes] = {}  # id -> its entry (the model)
    for kind, numbers, lost in steps:
        ids = [f"id-{n}" for n in numbers]
        if kind == "many":
            command = IDEM.command_many(stream, None, [(i, ["n", i]) for i in ids])
            replies = r.execute_command(*command)
            if lost:  # the reply never arrived: the publisher's retry
                replies = r.execute_command(*command)
        else:
            ids = ids[:1]
            command = IDEM.command(stream, ids[0], None, ["n", ids[0]], auto=False)
            replies = [r.execute_command(*command)]
            if lost:
                replies = [r.execute_command(*command)]
        seen: set[str] = set()
        for idem, reply in zip(ids, replies, strict=True):
            done = appended(reply)
            assert done is not None
            entry, repeat = done
            if idem in first:
                assert repeat and entry == first[idem], (idem, reply)
            else:
                # New in this call: appended now, or (a lost reply's retry) the
                # same entry as the first send, a repeat.
                assert repeat == (lost or idem in seen), (idem, reply)
                first[idem] = entry
            seen.add(idem)
        entries = r.xrange(stream)
        assert len(entries) == len(first)  # no duplicate, no loss
        assert {e: f[b"n"].decode() for e, f in entries} == {e: i for i, e in first.items()}
    assert r.hlen(slot_key(stream, "idem")) == len(first)


@pytest.mark.parametrize("any_redis", ["standalone", "cluster"], indirect=True)
async def test_batched_check_and_append_on_a_missing_stream_writes_nothing(
    any_redis: RedisTarget,
) -> None:
    r = redis_client(any_redis)
    try:
        live, gone = "{pm}:live:0", "{pm2}:gone:0"
        await r.xgroup_create(live, "g", id="0", mkstream=True)
        batch = [("a", ["n", "1"]), ("b", ["n", "2"]), ("a", ["n", "3"])]
        replies = await IDEMPOTENT_XADD_MANY.run(r, *_split(IDEM.command_many(gone, None, batch)))
        assert [appended(x) for x in replies] == [None, None, None]
        assert await r.exists(gone, slot_key(gone, "idem"), slot_key(gone, "idem:order")) == 0
        replies = await IDEMPOTENT_XADD_MANY.run(r, *_split(IDEM.command_many(live, 5, batch)))
        done = [appended(x) for x in replies]
        assert done[0] is not None and done[2] == (done[0][0], True)
        assert done[1] is not None and not done[1][1]
        assert await r.xlen(live) == 2
        # The one-entry script reads the same record: a repeat.
        again = await IDEMPOTENT_XADD.run(
            r, *_split(IDEM.command(live, "b", None, ["n", "4"], auto=False))
        )
        assert appended(again) == (done[1][0], True)
    finally:
        await r.aclose()


def _split(command: tuple[Any, ...]) -> tuple[list[Any], list[Any]]:
    # ("EVALSHA", sha, numkeys, *keys, *args) -> (keys, args)
    n = command[2]
    return list(command[3 : 3 + n]), list(command[3 + n :])


async def test_concurrent_idempotent_publishes_merge_into_batched_scripts(stack: Any) -> None:
    # 10 ids, each published 4 times by concurrent callers, mixed with plain
    # publishes: the coalescer's pipeline merges the one-entry scripts per
    # shard; each id is appended once and every caller gets its entry.
    pub = await stack.started_publisher(4)
    results: dict[str, list[Any]] = {}

    async def one(n: int) -> None:
        idem = f"order-{n % 10}"
        result = await pub.publish(f"k{n % 10}", {"n": n}, idempotency_id=idem)
        results.setdefault(idem, []).append(result)
        await pub.publish(f"p{n}", {"plain": n})

    async with anyio.create_task_group() as tg:
        for n in range(40):
            tg.start_soon(one, n)
    assert pub._coalescer is not None and pub._coalescer.pipelines > 0
    total = sum([await stack.redis.xlen(stack.key(s)) for s in range(4)])
    assert total == 10 + 40
    for got in results.values():
        assert len({(r.stream_key, r.record_id) for r in got}) == 1
        assert sum(not r.deduplicated for r in got) == 1
    assert pub.deduplicated == 30
