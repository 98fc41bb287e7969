"""The consumer of the chaos soak: a ``streamkit run`` app that records, per
read and per handled entry, who did it and when.

Records go to a line-buffered file of this process (``SKC_RECORD``), never
to the Redis under test, so a SIGKILL loses nothing that was written and a
Redis failover cannot roll the records back.  Times are ``CLOCK_MONOTONIC``
nanoseconds, which every process on the machine shares.

* ``B shard member epoch pid t lease_deadline`` right before a read is sent;
  ``lease_deadline`` is when the member's assignment lease ends (a read
  cannot act in Redis after it: ``BLOCK`` is shorter and the read is
  abandoned at that instant).
* ``E shard member epoch pid t count`` when the read returned or failed.
* ``H seq key shard member epoch pid t0 t1 entry_id redelivered`` once per
  handler run that finished (a run killed half-way is not "handled").
* ``A member epoch pid t shards`` when shards are assigned (for reading the
  records by hand; the checks do not need it).

With ``SKC_IDEMPOTENT=1`` the listener is idempotent and each handled entry
stages ``HINCRBY {<shard key>}:applied <seq> 1``: the harness reads these
counters at the end, and any above 1 is a duplicate effect.
"""

from __future__ import annotations

import os
import time

import anyio

from streamkit import Message, ShardContext, StreamKit

PID = os.getpid()


class Recorder:
    """Read observer and lifecycle at once: the lifecycle only keeps each
    member's context, so reads can be stamped with the lease they rely on."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)
        self._contexts: dict[str, ShardContext] = {}

    # -- lifecycle: remember the member's live context ------------------------

    async def on_assigned(self, shards: frozenset[int], ctx: ShardContext) -> None:
        self._contexts[ctx.member_id] = ctx
        self._file.write(
            f"A {ctx.member_id} {ctx.epoch} {PID} {time.monotonic_ns()} "
            f"{','.join(map(str, sorted(shards)))}\n"
        )

    async def on_revoked(self, shards: frozenset[int], ctx: ShardContext) -> None:
        return None

    async def on_lost(self, shards: frozenset[int], ctx: ShardContext) -> None:
        return None

    def epoch(self, member_id: str) -> int:
        ctx = self._contexts.get(member_id)
        return ctx.epoch if ctx is not None else -1

    # -- read observer ---------------------------------------------------------

    def read_started(self, shard: int, member_id: str, epoch: int) -> None:
        now = time.monotonic_ns()
        ctx = self._contexts.get(member_id)
        # +1 ms: the lease is kept in whole milliseconds; round its end up so
        # the overlap check can only get stricter.
        remaining_ms = ctx.lease_remaining_ms() + 1 if ctx is not None else 10**9
        deadline = now + remaining_ms * 1_000_000
        self._file.write(f"B {shard} {member_id} {epoch} {PID} {now} {deadline}\n")

    def read_finished(self, shard: int, member_id: str, epoch: int, count: int) -> None:
        self._file.write(f"E {shard} {member_id} {epoch} {PID} {time.monotonic_ns()} {count}\n")

    def handled(self, msg: Message, t0: int) -> None:
        f = msg.fields
        self._file.write(
            f"H {f['seq']} {f['key']} {msg.shard} {msg.member_id} {self.epoch(msg.member_id)} "
            f"{PID} {t0} {time.monotonic_ns()} {msg.id} {int(msg.redelivered)}\n"
        )


recorder = Recorder(os.environ["SKC_RECORD"])
work_s = float(os.environ.get("SKC_WORK_MS", "2")) / 1000
idempotent = os.environ.get("SKC_IDEMPOTENT") == "1"

app = StreamKit(read_observer=recorder)


@app.stream_listener(
    stream_prefix=os.environ["SKC_PREFIX"],
    group=os.environ["SKC_GROUP"],
    concurrency=int(os.environ.get("SKC_CONCURRENCY", "2")),
    batch_size=int(os.environ.get("SKC_BATCH", "20")),
    block_ms=int(os.environ.get("SKC_BLOCK_MS", "500")),
    lifecycle=recorder,
    idempotent=idempotent,
)
async def handle(msg: Message) -> None:
    t0 = time.monotonic_ns()
    await anyio.sleep(work_s)
    if idempotent:
        msg.effects.hincrby(msg.effects.key("applied"), msg.fields["seq"], 1)
    recorder.handled(msg, t0)
    await msg.ack()
