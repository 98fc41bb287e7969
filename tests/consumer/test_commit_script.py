"""Property tests of the idempotent commit (marker + effects + ack + fencing)
against a real Redis: random sequences of reads, commits (current or stale
token, duplicate ids, effects that fail on a key of another type) and new
readers, checked step by step against a model of what must hold.

What must hold: a commit applies all of its effects, writes its marker and
acks its entry, or does none of it; it does nothing but ack when the marker
exists; it does nothing at all with a token older than the shard's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamkit.consumer.idempotence import Commit, Idempotence
from streamkit.consumer.shard_io import ShardIO
from streamkit.scripts import COMMIT, is_fenced
from streamkit.testing import RedisServer

GROUP = "g"
IDEMPOTENCE = Idempotence(marker_ttl=3600, max_markers=10_000)

# (command, key name, the type it makes, argument maker)
EFFECTS = {
    "hincr": ("HINCRBY", "h", "hash"),
    "incr": ("INCRBY", "c", "string"),
    "hincr-on-c": ("HINCRBY", "c", "hash"),  # wrong type once "c" is a string
    "incr-on-h": ("INCRBY", "h", "string"),  # wrong type once "h" is a hash
}

ops = st.lists(
    st.one_of(
        st.tuples(st.just("read"), st.integers(1, 3), st.lists(st.integers(0, 5), min_size=3)),
        st.tuples(
            st.just("commit"),
            st.booleans(),  # with a stale token
            st.lists(  # the commits of one script
                st.tuples(
                    st.integers(0, 30),  # which delivered entry (modulo)
                    st.lists(
                        st.tuples(st.sampled_from(sorted(EFFECTS)), st.integers(1, 5)), max_size=3
                    ),
                ),
                min_size=1,
                max_size=3,
            ),
        ),
        st.just(("fence",)),
    ),
    max_size=25,
)


@dataclass
class Model:
    markers: set[bytes] = field(default_factory=set)
    pending: set[bytes] = field(default_factory=set)
    values: dict[str, int] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=ops)
def test_commit_is_all_or_nothing_fenced_and_once(
    redis_server: RedisServer, steps: list[Any]
) -> None:
    r = redis.Redis.from_url(redis_server.url)
    try:
        run(r, steps)
    finally:
        r.close()


def run(r: redis.Redis, steps: list[Any]) -> None:
    stream = f"prop-{uuid.uuid4().hex[:8]}:0"
    r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    io = ShardIO(
        r,  # type: ignore[arg-type] - commit_command only reads its keys
        stream_key=stream,
        consumer_group=GROUP,
        member_id="m",
        xackdel=False,
        dead_letter_key=f"{stream}:dlq",
        dead_letter_maxlen=10,
    )
    r.script_load(COMMIT.source)
    keys = {"h": f"{{{stream}}}:h", "c": f"{{{stream}}}:c"}
    model = Model()
    delivered: list[tuple[bytes, bytes]] = []  # (entry id, idempotency id)
    token = str(r.incr(io.fence_key)).encode()
    stale = b"0"
    for step in steps:
        if step[0] == "fence":  # a new reader takes the shard
            stale, token = token, str(r.incr(io.fence_key)).encode()
        elif step[0] == "read":
            _, count, pool = step
            for n in range(count):
                idem = f"id-{pool[n % len(pool)]}".encode()
                entry = r.xadd(stream, {"idempotency-id": idem})
                delivered.append((entry, idem))
            for entry, _ in r.xreadgroup(GROUP, "m", {stream: ">"})[0][1]:
                model.pending.add(entry)
        else:
            _, use_stale, batch = step
            if not delivered:
                continue
            commits, expected = [], []
            for which, effects in batch:
                entry, idem = delivered[which % len(delivered)]
                staged = [
                    (
                        EFFECTS[e][0],
                        keys[EFFECTS[e][1]],
                        ([b"n"] if EFFECTS[e][0] == "HINCRBY" else []) + [amount],
                    )
                    for e, amount in effects
                ]
                commits.append(Commit(entry, idem, effects=staged))
                expected.append((entry, idem, effects))
            command = io.commit_command(commits, stale if use_stale else token, IDEMPOTENCE)
            try:
                replies: list[Any] = [
                    redis.ResponseError(x.decode()) if isinstance(x, bytes) else x
                    for x in r.execute_command(*command)
                ]
            except redis.ResponseError as exc:
                replies = [exc] * len(commits)
            for reply, (entry, idem, effects) in zip(replies, expected, strict=True):
                expect(model, reply, entry, idem, use_stale, effects)
        check(r, model, stream, keys, io.marker_key)


def expect(
    model: Model, reply: Any, entry: bytes, idem: bytes, stale: bool, effects: list[Any]
) -> None:
    if stale:
        assert is_fenced(reply), reply
        return
    if idem in model.markers:
        assert reply == 0, reply
        model.pending.discard(entry)
        return
    types = dict(model.types)
    for name, _ in effects:
        _, key, kind = EFFECTS[name]
        if types.setdefault(key, kind) != kind:
            assert isinstance(reply, redis.ResponseError) and "WRONGTYPE" in str(reply), reply
            return
    assert reply == 1, str(reply)
    model.types = types
    for name, amount in effects:
        key = EFFECTS[name][1]
        model.values[key] = model.values.get(key, 0) + amount
    model.markers.add(idem)
    model.pending.discard(entry)


def check(r: redis.Redis, model: Model, stream: str, keys: dict[str, str], markers: str) -> None:
    pending = {p["message_id"] for p in r.xpending_range(stream, GROUP, "-", "+", 1000)}
    assert pending == model.pending
    assert set(r.zrange(markers, 0, -1)) == model.markers
    for name, kind in model.types.items():
        assert r.type(keys[name]).decode() == kind
        stored = r.hget(keys[name], "n") if kind == "hash" else r.get(keys[name])
        assert int(stored or 0) == model.values.get(name, 0)
