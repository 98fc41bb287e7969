"""A ``streamkit run`` app for the resharding tests, configured by ``RSK_*`` variables.

Writes one line per handled entry (``n stream_key``), line-buffered so that a
SIGKILL loses nothing already written, then acks.
"""

from __future__ import annotations

import os

from streamkit import Message, StreamKit

record = open(os.environ["RSK_RECORD"], "a", buffering=1)

app = StreamKit()


@app.stream_listener(
    stream_prefix=os.environ["RSK_PREFIX"],
    group=os.environ["RSK_GROUP"],
    concurrency=int(os.environ.get("RSK_CONCURRENCY", "1")),
    batch_size=20,
)
async def handle(msg: Message) -> None:
    record.write(f"{msg.fields['n']} {msg.stream_key}\n")
    await msg.ack()
