"""An idempotent StreamKit app for the SIGKILL tests, configured by ``SKT_*`` variables.

Each handled entry stages ``HINCRBY {<shard key>}:count n 1`` on the message:
the counter moves exactly once per idempotency id however often the app is
killed.  ``SKT_SLEEP_MS`` pauses in the handler, so that kills land while
entries are being handled or their commits are queued.
"""

from __future__ import annotations

import os

import anyio

from streamkit import Message, StreamKit

sleep_s = float(os.environ.get("SKT_SLEEP_MS", "0")) / 1000

app = StreamKit()


@app.stream_listener(
    stream_prefix=os.environ["SKT_PREFIX"],
    group=os.environ["SKT_GROUP"],
    concurrency=int(os.environ.get("SKT_CONCURRENCY", "1")),
    batch_size=int(os.environ.get("SKT_BATCH", "20")),
    idempotent=True,
    auto_ack=True,
)
async def handle(msg: Message) -> None:
    if sleep_s:
        await anyio.sleep(sleep_s)
    msg.effects.hincrby(msg.effects.key("count"), "n", 1)
