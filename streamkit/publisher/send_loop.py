"""The one send loop of ``Publisher.publish`` and ``publish_many``.

Kept apart from ``streamkit.publisher.publisher`` only for length: it is the
publisher's ``_send`` method (``self`` is the publisher) and reads its parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import anyio
import redis.exceptions

from streamkit.connections import send_commands
from streamkit.publisher.encoding import PartitionKey, text
from streamkit.publisher.errors import StaleRouteError
from streamkit.publisher.idempotence import appended
from streamkit.publisher.router import Router, RoutingSnapshot
from streamkit.results import PublishResult
from streamkit.routing import shard_for_key
from streamkit.scripts import IDEMPOTENT_XADD, IDEMPOTENT_XADD_MANY, is_noscript

__all__ = ["Ids", "send"]

# Errors after which the command may or may not have been applied: retrying is
# what makes delivery at-least-once instead of at-most-once.
_RETRYABLE: Final = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
#: Idempotency ids of a send, per entry: (id, drawn by the publisher); None:
#: the entry is not idempotent.
Ids = list[tuple[str, bool] | None]


async def send(
    self: Any,  # the Publisher (not imported: that would be an import cycle)
    entries: list[tuple[PartitionKey, list[Any]]],
    pending: Sequence[int],
    results: list[PublishResult | None],
    errors: dict[int, BaseException],
    single: bool,
    ids: Ids | None = None,
) -> int:
    """Send the entries at ``pending`` until each has a result or an error
    (the one loop of ``publish`` and ``publish_many``); the routing version used.

    Connection errors, timeouts and stale routes are retried, up to
    ``max_attempts`` sends. A ``single`` publish raises its error; a batch
    records errors per entry.  Idempotent entries (``ids``) are sent as
    check-and-append scripts, and a retry goes to the shard of the first
    attempt while that shard's stream exists (its dedup record is there).
    """
    router: Router = self._router
    version = -1
    attempt = 1
    # Idempotent entries: input index -> (stream key, shard) of the first attempt.
    pins: dict[int, tuple[str, int]] = {}
    while pending:
        if self._clock() < router.fast_until:
            snap: RoutingSnapshot = router.snap
        else:
            snap = await self._route_slow(entries[pending[0]][0])
        version = snap.version
        seq = router.refresher.started
        count, heads = snap.count, snap.heads
        try:
            if single and ids is None:  # coalesced with concurrent publishes; errors raise
                key, args = entries[0]
                index = shard_for_key(key, count)
                reply = await self._send_one(*heads[index], *args)
                if reply is not None:  # appended: the common case, kept short
                    results[0] = PublishResult(snap.keys[index], index, text(reply), snap.version)
                    self.published += 1
                    return version
                shards, replies = [index], [reply]
            elif ids is None:
                shards = [shard_for_key(entries[i][0], count) for i in pending]
                replies = await send_commands(
                    self._redis,
                    [(*heads[s], *entries[i][1]) for i, s in zip(pending, shards, strict=True)],
                )
            else:
                shards = []
                for i in pending:
                    pin = pins.setdefault(i, _first_shard(snap, entries[i][0]))
                    shards.append(pin[1])
                if single or self._idem.native:
                    commands = []
                    for i in pending:
                        idem = ids[i]
                        assert idem is not None
                        commands.append(
                            self._idem.command(
                                pins[i][0], idem[0], self.maxlen, entries[i][1], auto=idem[1]
                            )
                        )
                    if single:
                        replies = [await self._send_one(*commands[0])]
                    else:
                        replies = await send_commands(self._redis, commands)
                else:
                    # One batched script per shard (not for XADD IDMP: a command).
                    replies = await _send_grouped(self, entries, pending, pins, ids)
        except _RETRYABLE as exc:
            if attempt >= self.max_attempts or _fatal(exc):
                raise
            self.retries += len(pending)
            await anyio.sleep(min(self.retry_backoff * 2 ** (attempt - 1), 1.0))
            attempt += 1
            continue
        except redis.exceptions.ResponseError as exc:
            if not is_noscript(exc) or attempt >= self.max_attempts:
                raise
            # The server lost its script cache (restart, failover): load, send again.
            await _load_scripts(self._redis)
            attempt += 1
            continue
        retry: list[int] = []
        stale: dict[int, list[int]] = {}  # shard -> input indexes
        noscript = False
        for i, index, reply in zip(pending, shards, replies, strict=True):
            if ids is not None and not isinstance(reply, BaseException):
                # Idempotent: (entry id, repeat) or None (no stream).
                done = appended(reply)
                key = pins[i][0]
                if done is None and key != snap.keys[shard_for_key(entries[i][0], count)]:
                    # The first attempt's shard is gone (retired after its
                    # drain): route afresh.
                    del pins[i]
                    retry.append(i)
                    continue
                if done is not None:
                    results[i] = PublishResult(
                        key, index, text(done[0]), snap.version, deduplicated=done[1]
                    )
                    self.published += 1
                    self.deduplicated += done[1]
                    continue
                reply = None
            if reply is None:
                stale.setdefault(index, []).append(i)
            elif isinstance(reply, BaseException):
                if attempt < self.max_attempts and isinstance(reply, _RETRYABLE):
                    retry.append(i)
                elif attempt < self.max_attempts and is_noscript(reply):
                    noscript = True
                    retry.append(i)
                else:
                    errors[i] = reply
            else:
                results[i] = PublishResult(snap.keys[index], index, text(reply), snap.version)
                self.published += 1
        if noscript:
            await _load_scripts(self._redis)
        for index, indexes in stale.items():
            try:
                # XADD NOMKSTREAM found no stream: returns once routing moved on.
                await router.stale(snap, index, seq, cooldown=self.stale_route_cooldown)
                if attempt >= self.max_attempts:
                    raise router.stale_error(snap, index, "routing kept changing")
            except StaleRouteError as exc:
                for i in indexes:
                    errors[i] = exc
                continue
            for i in indexes:
                pins.pop(i, None)
            retry.extend(indexes)
        if retry:
            self.retries += len(retry)
        pending = sorted(retry)  # keep input order among the retried
        attempt += 1
    if single and errors:
        raise errors[0]
    return version


#: Entries per batched check-and-append call: bounds one script's run time.
_PER_SCRIPT: Final = 200


async def _send_grouped(
    self: Any, entries: list[Any], pending: Sequence[int], pins: dict[int, Any], ids: Ids
) -> list[Any]:
    """The idempotent entries at ``pending``, one batched script per shard
    (``IDEMPOTENT_XADD_MANY``) in one round trip; a reply per entry, in order.

    One call per shard instead of one per entry is what keeps an idempotent
    ``publish_many`` close to a plain one (docs/performance.md)."""
    groups: dict[str, list[int]] = {}
    for i in pending:
        groups.setdefault(pins[i][0], []).append(i)
    calls: list[list[int]] = []
    commands = []
    for key, indexes in groups.items():
        for lo in range(0, len(indexes), _PER_SCRIPT):
            chunk = indexes[lo : lo + _PER_SCRIPT]
            calls.append(chunk)
            commands.append(
                self._idem.command_many(
                    key,
                    self.maxlen,
                    [(ids[i][0], entries[i][1]) for i in chunk],  # type: ignore[index]
                )
            )
    replies = await send_commands(self._redis, commands)
    out: dict[int, Any] = {}
    for chunk, reply in zip(calls, replies, strict=True):
        if isinstance(reply, BaseException):
            out.update(dict.fromkeys(chunk, reply))
        else:
            out.update(zip(chunk, reply, strict=True))
    return [out[i] for i in pending]


async def _load_scripts(redis: Any) -> None:
    # The server lost its script cache (restart, failover).
    await redis.script_load(IDEMPOTENT_XADD.source)
    await redis.script_load(IDEMPOTENT_XADD_MANY.source)


def _first_shard(snap: RoutingSnapshot, partition_key: PartitionKey) -> tuple[str, int]:
    index = shard_for_key(partition_key, snap.count)
    return snap.keys[index], index


def _fatal(exc: BaseException) -> bool:
    # A wrong password is a ConnectionError subclass, but retrying cannot fix it.
    return isinstance(exc, redis.exceptions.AuthenticationError)
