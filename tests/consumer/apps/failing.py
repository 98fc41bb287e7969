"""A ``streamkit run`` app whose handler fails on entries with a ``poison`` field.

The failure policy comes from ``SKT_*`` variables.  With ``SKT_HEALED`` set,
poison entries stop failing once that file exists: the bug has been fixed,
and a replayed dead letter is handled.  Every handler call is
written as ``H <stream key>/<id> <member> <attempt>`` (line-buffered, so a
SIGKILL loses nothing already written).
"""

from __future__ import annotations

import os

import anyio

from streamkit import Message, StreamKit
from streamkit.consumer.failure import FailurePolicy

record = open(os.environ["SKT_RECORD"], "a", buffering=1)
healed = os.environ.get("SKT_HEALED")

app = StreamKit()


@app.stream_listener(
    stream_prefix=os.environ["SKT_PREFIX"],
    group=os.environ["SKT_GROUP"],
    batch_size=int(os.environ.get("SKT_BATCH", "10")),
    failure_policy=FailurePolicy(
        max_attempts=int(os.environ["SKT_MAX_ATTEMPTS"]),
        backoff_initial_ms=int(os.environ["SKT_BACKOFF_MS"]),
        backoff_max_ms=60_000,
        backoff_multiplier=float(os.environ.get("SKT_MULTIPLIER", "2")),
        jitter=0.0,
    ),
)
async def handle(msg: Message) -> None:
    record.write(f"H {msg.stream_key}/{msg.id} {msg.member_id} {msg.attempt}\n")
    if "poison" in msg.fields and not (healed and await anyio.Path(healed).exists()):
        raise RuntimeError("poison")
    await msg.ack()
