"""A StreamKit app for the subprocess tests, configured by ``SKT_*`` variables.

It records, line by line (line-buffered, so a SIGKILL loses nothing that
was written), every read its pollers issue (``B``/``E`` lines with the
monotonic clock, which Linux shares between processes) and every handled
entry (``H`` lines).  The tests rebuild read intervals from these records to
check that no shard ever had two readers at once.
"""

from __future__ import annotations

import os
import time

import anyio

from streamkit import Message, StreamKit

PID = os.getpid()


class FileRecorder:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)

    def read_started(self, shard: int, member_id: str, epoch: int) -> None:
        self._file.write(f"B {shard} {member_id} {epoch} {PID} {time.monotonic_ns()}\n")

    def read_finished(self, shard: int, member_id: str, epoch: int, count: int) -> None:
        self._file.write(f"E {shard} {member_id} {epoch} {PID} {time.monotonic_ns()} {count}\n")

    def handled(self, msg: Message) -> None:
        self._file.write(f"H {msg.stream_key}/{msg.id} {msg.member_id}\n")


recorder = FileRecorder(os.environ["SKT_RECORD"])
sleep_s = float(os.environ.get("SKT_SLEEP_MS", "0")) / 1000

app = StreamKit(read_observer=recorder)


@app.stream_listener(
    stream_prefix=os.environ["SKT_PREFIX"],
    group=os.environ["SKT_GROUP"],
    concurrency=int(os.environ.get("SKT_CONCURRENCY", "1")),
    batch_size=int(os.environ.get("SKT_BATCH", "50")),
)
async def handle(msg: Message) -> None:
    recorder.handled(msg)
    if sleep_s:
        await anyio.sleep(sleep_s)
    await msg.ack()
