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
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamkit.consumer.idempotence import Commit, Idempotence
from streamkit.consumer.shard_io import ShardIO
from streamkit.scripts import COMMIT, COMMIT_ACKS, READ_MARKED, is_fenced
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
        st.tuples(
            st.just("read"),
            st.integers(1, 3),
            st.lists(st.integers(0, 5), min_size=3),
            st.booleans(),  # through READ_MARKED (which also answers the markers)
        ),
        st.tuples(
            st.just("commit"),
            st.booleans(),  # with a stale token
            st.lists(  # the commits of one script
                st.tuples(
                    st.integers(0, 30),  # which delivered entry (modulo)
                    st.lists(
                        st.tuples(st.sampled_from(sorted(EFFECTS)), st.integers(1, 5)), max_size=3
                    ),
                    st.booleans(),  # ack and delete
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
    deleted: set[bytes] = field(default_factory=set)
    values: dict[str, int] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=ops)
# Pinned: one id twice in one script without effects (COMMIT_ACKS: the second
# is a duplicate), and a read through READ_MARKED of an id already marked.
@example(steps=[("read", 2, [1, 1, 1], False), ("commit", False, [(0, [], True), (1, [], False)])])
@example(steps=[("read", 1, [2, 2, 2], False), ("commit", False, [(0, [], False)]),
                ("read", 2, [2, 3, 3], True)])  # fmt: skip
def test_commit_is_all_or_nothing_fenced_and_once(
    redis_server: RedisServer, steps: list[Any]
) -> None:
    with redis.Redis.from_url(redis_server.url) as r:
        run(r, steps)


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
    for script in (COMMIT, COMMIT_ACKS, READ_MARKED):
        r.script_load(script.source)
    keys = {"h": f"{{{stream}}}:h", "c": f"{{{stream}}}:c"}
    model = Model()
    delivered: list[tuple[bytes, bytes]] = []  # (entry id, idempotency id)
    token = str(r.incr(io.fence_key)).encode()
    stale = b"0"
    for step in steps:
        if step[0] == "fence":  # a new reader takes the shard
            stale, token = token, str(r.incr(io.fence_key)).encode()
        elif step[0] == "read":
            _, count, pool, marked = step
            for n in range(count):
                idem = f"id-{pool[n % len(pool)]}".encode()
                entry = r.xadd(stream, {"idempotency-id": idem})
                delivered.append((entry, idem))
            if marked:
                read = READ_MARKED.command(
                    [stream, io.marker_key], [GROUP, "m", 100, "idempotency-id"]
                )
                entries, marks = r.execute_command(*read)
                # Each entry's mark says whether its idempotency id has a marker.
                assert [bool(m) for m in marks] == [
                    dict(zip(f[::2], f[1::2], strict=True))[b"idempotency-id"] in model.markers
                    for _, f in entries
                ]
            else:
                entries = r.xreadgroup(GROUP, "m", {stream: ">"})[0][1]
            for entry, _ in entries:
                model.pending.add(entry)
        else:
            _, use_stale, batch = step
            if not delivered:
                continue
            commits, expected = [], []
            for which, effects, delete in batch:
                entry, idem = delivered[which % len(delivered)]
                staged = [
                    (
                        EFFECTS[e][0],
                        keys[EFFECTS[e][1]],
                        ([b"n"] if EFFECTS[e][0] == "HINCRBY" else []) + [amount],
                    )
                    for e, amount in effects
                ]
                commits.append(Commit(entry, idem, delete=delete, effects=staged))
                expected.append((entry, idem, effects, delete))
            command = io.commit_command(commits, stale if use_stale else token, IDEMPOTENCE)
            try:
                raw = r.execute_command(*command)
            except redis.ResponseError as exc:
                replies: list[Any] = [exc] * len(commits)
            else:
                if isinstance(raw, int):
                    # COMMIT_ACKS answers how many markers were new: the model's
                    # count, and then which ones (the model's) are booked.
                    replies = new_markers(model, [idem for _, idem, _, _ in expected])
                    assert raw == sum(replies), (raw, replies)
                else:
                    replies = [
                        redis.ResponseError(x.decode()) if isinstance(x, bytes) else x for x in raw
                    ]
            for reply, (entry, idem, effects, delete) in zip(replies, expected, strict=True):
                if expect(model, reply, entry, idem, use_stale, effects) and delete:
                    model.deleted.add(entry)
        all_ids = {entry for entry, _ in delivered}
        assert {e for e, _ in r.xrange(stream)} == all_ids - model.deleted
        check(r, model, stream, keys, io.marker_key)


def new_markers(model: Model, idems: list[bytes]) -> list[int]:
    """1 for each id the model has no marker for (its first time in the list), else 0."""
    seen = set(model.markers)
    out = []
    for idem in idems:
        out.append(0 if idem in seen else 1)
        seen.add(idem)
    return out


def expect(
    model: Model, reply: Any, entry: bytes, idem: bytes, stale: bool, effects: list[Any]
) -> bool:
    """Check one commit's reply against the model; True if it acked its entry."""
    if stale:
        assert is_fenced(reply), reply
        return False
    if idem in model.markers:
        assert reply == 0, reply
        model.pending.discard(entry)
        return True
    types = dict(model.types)
    for name, _ in effects:
        _, key, kind = EFFECTS[name]
        if types.setdefault(key, kind) != kind:
            assert isinstance(reply, redis.ResponseError) and "WRONGTYPE" in str(reply), reply
            return False
    assert reply == 1, str(reply)
    model.types = types
    for name, amount in effects:
        key = EFFECTS[name][1]
        model.values[key] = model.values.get(key, 0) + amount
    model.markers.add(idem)
    model.pending.discard(entry)
    return True


def check(r: redis.Redis, model: Model, stream: str, keys: dict[str, str], markers: str) -> None:
    pending = {p["message_id"] for p in r.xpending_range(stream, GROUP, "-", "+", 1000)}
    assert pending == model.pending
    assert set(r.zrange(markers, 0, -1)) == model.markers
    for name, kind in model.types.items():
        assert r.type(keys[name]).decode() == kind
        stored = r.hget(keys[name], "n") if kind == "hash" else r.get(keys[name])
        assert int(stored or 0) == model.values.get(name, 0)
