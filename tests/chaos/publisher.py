"""The publisher of the chaos soak, run as its own process:
``python -m tests.chaos.publisher``.

Publishes entries numbered ``seq`` = 0, 1, 2, ... over ``SKC_KEYS`` partition
keys at ``SKC_RATE`` per second through a real ``Publisher``, and writes
``P seq key shard entry_id t`` to ``SKC_RECORD`` once Redis accepted an entry.
A publish Redis refused because it is at ``maxmemory``
(``OutOfMemoryError``: nothing was appended) is recorded as ``R seq key t``.
A failed publish is retried with the same ``seq`` until it succeeds (a retry
whose first attempt did land is a duplicate, never a gap; with
``SKC_IDEMPOTENT=1`` every publish carries the idempotency id ``seq-<seq>``,
so such a retry returns the first entry instead).  A restarted
publisher goes on after the last ``seq`` its record file holds.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import TextIO

import anyio
from redis.exceptions import OutOfMemoryError

from streamkit.publisher.publisher import Publisher
from streamkit.settings import StreamKitSettings

log = logging.getLogger("chaos.publisher")


def open_record(path: Path) -> TextIO:
    return open(path, "a", buffering=1)  # line-buffered: a kill loses no record


def next_seq(path: Path) -> int:
    last = -1
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "P":
                last = max(last, int(parts[1]))
    return last + 1


async def main() -> None:
    record = Path(os.environ["SKC_RECORD"])
    rate = float(os.environ.get("SKC_RATE", "50"))
    keys = int(os.environ.get("SKC_KEYS", "16"))
    idempotent = os.environ.get("SKC_IDEMPOTENT") == "1"
    seq = next_seq(record)
    stop = anyio.Event()
    out = open_record(record)
    publisher = Publisher(
        os.environ["SKC_PREFIX"], os.environ["SKC_GROUP"], settings=StreamKitSettings()
    )

    async def on_signal() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                stop.set()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(on_signal)
        started = time.monotonic()
        sent = 0
        failures = 0
        while not stop.is_set():
            key = f"k{seq % keys}"
            try:
                with anyio.fail_after(5):
                    result = await publisher.publish(
                        key,
                        {"seq": seq, "key": key},
                        idempotency_id=f"seq-{seq}" if idempotent else None,
                    )
            except Exception as exc:  # every failure: retry the same seq
                failures += 1
                if isinstance(exc, OutOfMemoryError):
                    # Refused, typed, not retried by the Publisher: a user backs
                    # off and publishes again, as this loop does.
                    out.write(f"R {seq} {key} {time.monotonic_ns()}\n")
                if failures == 1 or failures % 20 == 0:
                    log.warning("publish of %d failed (%d in a row): %r", seq, failures, exc)
                await anyio.sleep(min(0.5, 0.02 * failures))
                continue
            failures = 0
            out.write(
                f"P {seq} {key} {result.shard_index} {result.record_id} {time.monotonic_ns()}\n"
            )
            seq += 1
            sent += 1
            # Steady rate; after an outage, catch up at most one second's worth.
            started = max(started, time.monotonic() - 1.0 - sent / rate)
            await anyio.sleep(max(0.0, started + sent / rate - time.monotonic()))
        tg.cancel_scope.cancel()
    with anyio.CancelScope(shield=True):
        await publisher.aclose()
    out.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    anyio.run(main)
