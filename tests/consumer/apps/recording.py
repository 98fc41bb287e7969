"""A StreamKit app for the subprocess tests, configured by ``SKT_*`` variables.

It records, line by line (line-buffered, so a SIGKILL loses nothing that
was written), every read its pollers issue (``B``/``E`` lines with the
monotonic clock, which Linux shares between processes), every handler call
(``S``/``F`` at its start and finish, with the member and its epoch), every
handled entry (``H`` lines) and every loss of shards (``L``).  The tests
rebuild read and processing intervals from these records to check that no
shard ever had two readers, or two members processing it, at once.
"""

from __future__ import annotations

import os
import time

import anyio

from streamkit import Message, StreamKit
from streamkit.consumer.lifecycle import ShardContext

PID = os.getpid()


class FileRecorder:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)
        # The epoch of each member's latest read of a shard: the epoch the
        # entries it hands to the handler were read under.
        self._epochs: dict[tuple[int, str], int] = {}

    def read_started(self, shard: int, member_id: str, epoch: int) -> None:
        self._epochs[(shard, member_id)] = epoch
        self._file.write(f"B {shard} {member_id} {epoch} {PID} {time.monotonic_ns()}\n")

    def read_finished(self, shard: int, member_id: str, epoch: int, count: int) -> None:
        self._file.write(f"E {shard} {member_id} {epoch} {PID} {time.monotonic_ns()} {count}\n")

    def handled(self, msg: Message) -> None:
        self._file.write(f"H {msg.stream_key}/{msg.id} {msg.member_id}\n")

    def call(self, kind: str, msg: Message) -> None:
        """``S``/``F``: a handler call on the entry started/finished."""
        epoch = self._epochs.get((msg.shard, msg.member_id), 0)
        self._file.write(
            f"{kind} {msg.shard} {msg.member_id} {epoch} {PID} {time.monotonic_ns()} {msg.id}\n"
        )


class LossRecorder:
    """Shard hooks that only record when a member lost its shards (``L`` lines)."""

    def __init__(self, recorder: FileRecorder) -> None:
        self._file = recorder._file

    async def on_assigned(self, shards: frozenset[int], ctx: ShardContext) -> None:
        pass

    async def on_revoked(self, shards: frozenset[int], ctx: ShardContext) -> None:
        pass

    async def on_lost(self, shards: frozenset[int], ctx: ShardContext) -> None:
        self._file.write(f"L {ctx.member_id} {PID} {time.monotonic_ns()}\n")


recorder = FileRecorder(os.environ["SKT_RECORD"])
sleep_s = float(os.environ.get("SKT_SLEEP_MS", "0")) / 1000

app = StreamKit(read_observer=recorder)


@app.stream_listener(
    stream_prefix=os.environ["SKT_PREFIX"],
    group=os.environ["SKT_GROUP"],
    concurrency=int(os.environ.get("SKT_CONCURRENCY", "1")),
    batch_size=int(os.environ.get("SKT_BATCH", "50")),
    lifecycle=LossRecorder(recorder),
)
async def handle(msg: Message) -> None:
    recorder.call("S", msg)
    recorder.handled(msg)
    if sleep_s:
        await anyio.sleep(sleep_s)
    await msg.ack()
    recorder.call("F", msg)
