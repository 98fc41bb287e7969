"""Idempotent publishing: a retry after a lost reply never appends twice.

A TCP proxy between the publisher and Redis forwards every command, reads
Redis's reply and, every other time, closes the publisher's connection
instead of passing the reply on: the write reached Redis, the publisher saw
a connection error and retried.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import redis.asyncio
from anyio.abc import SocketStream
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from streamkit.publisher.idempotence import IDEMPOTENCY_FIELD, PublishIdempotence, supports_idmp
from streamkit.publisher.publisher import Publisher
from streamkit.scripts import slot_key

from .conftest import Stack

standalone = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)


_GONE = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class ReplyDroppingProxy:
    """Forwards to Redis; once ``dropping``, every connection is cut at its
    ``every``-th reply, which Redis produced but the client never gets.

    A retry runs on a fresh connection, whose first replies pass: a publish
    loses at most one reply in a row, so its retries never run out.
    """

    def __init__(self, port: int, every: int = 4) -> None:
        self._port = port
        self._every = every
        self.dropping = False
        self.dropped = 0

    async def serve(self, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        async with listener:
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            task_status.started(port)
            await listener.serve(self._handle)

    async def _handle(self, client: SocketStream) -> None:
        # An error escaping a handler would stop the listener: keep serving.
        try:
            await self._forward(client)
        except Exception:
            pass

    async def _forward(self, client: SocketStream) -> None:
        async with client, await anyio.connect_tcp("127.0.0.1", self._port) as server:
            async with anyio.create_task_group() as tg:
                asked = [False]  # a request went up since the last counted reply

                async def upstream() -> None:
                    try:
                        async for chunk in client:
                            # The connection handshake (HELLO, CLIENT ...) is not counted.
                            head = chunk[:24].upper()
                            asked[0] = b"HELLO" not in head and b"CLIENT" not in head
                            await server.send(chunk)
                    except _GONE:
                        pass
                    tg.cancel_scope.cancel()

                async def downstream() -> None:
                    replies = 0
                    try:
                        async for chunk in server:
                            # One count per exchange: a long reply comes in several chunks.
                            if self.dropping and asked[0]:
                                replies += 1
                            asked[0] = False
                            if replies == self._every:
                                # Applied in Redis, never answered: the
                                # publisher sees the connection break.
                                self.dropped += 1
                                break
                            await client.send(chunk)
                    except _GONE:
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(upstream)
                tg.start_soon(downstream)


@contextlib.asynccontextmanager
async def dropping(
    s: Stack, *, max_batch: int | None = None, **options: Any
) -> AsyncIterator[tuple[ReplyDroppingProxy, Publisher]]:
    """A started publisher (``s.publisher(**options)``, uncoalesced, quick
    retries) talking to the stack's Redis through a proxy that drops replies."""
    port = int(s.target.url.rsplit(":", 1)[1].split("/")[0])
    proxy = ReplyDroppingProxy(port)
    async with anyio.create_task_group() as tg:
        proxy_port = await tg.start(proxy.serve)
        client = _client(proxy_port)
        try:
            pub = s.publisher(redis=client, coalesce=False, **options)
            if max_batch is not None:
                pub.max_batch = max_batch
            pub.retry_backoff = 0.001
            pub.max_attempts = 10
            await pub.start()
            proxy.dropping = True
            yield proxy, pub
        finally:
            await client.aclose()
            tg.cancel_scope.cancel()


def _client(port: int) -> redis.asyncio.Redis:
    # No redis-py retries: the publisher's own retries are what is tested.
    return redis.asyncio.Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))


async def _entries(s: Stack, shards: int) -> list[dict[bytes, bytes]]:
    out = []
    for shard in range(shards):
        out += [fields for _, fields in await s.redis.xrange(s.key(shard))]
    return out


async def _publish_all(pub: Publisher, n: int, *, keyed: bool) -> None:
    # One at a time: the proxy counts exchanges, and a long pipeline's request
    # and replies interleave in many chunks (the batch test keeps batches small).
    for i in range(n):
        await pub.publish(f"k{i}", {"n": i}, idempotency_id=f"order-{i}" if keyed else None)


@standalone
async def test_lost_replies_never_duplicate_keyed_publishes(
    stack: Stack,
) -> None:
    s = stack
    await s.create_group(4)
    async with dropping(s) as (proxy, pub):
        await _publish_all(pub, 1000, keyed=True)
    entries = await _entries(s, 4)
    ids = [fields[IDEMPOTENCY_FIELD.encode()] for fields in entries]
    assert proxy.dropped > 100  # the retries happened ...
    assert pub.deduplicated > 100  # ... and were answered from the dedup record
    assert len(entries) == 1000 == len(set(ids))


@standalone
async def test_lost_replies_never_duplicate_drawn_ids(
    stack: Stack,
) -> None:
    s = stack
    await s.create_group(2)
    async with dropping(s, idempotent=True, max_batch=10) as (proxy, pub):
        await _publish_all(pub, 300, keyed=False)
        results = await pub.publish_many([(f"b{i}", {"n": i}) for i in range(200)])
    assert proxy.dropped > 10
    assert len(await _entries(s, 2)) == 500
    assert len({(r.stream_key, r.record_id) for r in results}) == 200


@standalone
async def test_plain_publishes_do_duplicate_through_the_same_proxy(
    stack: Stack,
) -> None:
    # The control: without idempotency the lost replies make copies.
    s = stack
    await s.create_group(2)
    async with dropping(s) as (_proxy, pub):
        await _publish_all(pub, 100, keyed=False)
    assert len(await _entries(s, 2)) > 100


async def test_same_id_again_returns_the_first_entry(stack: Stack) -> None:
    await stack.create_group(2)
    pub = stack.publisher()
    first = await pub.publish("k", {"a": 1}, idempotency_id="order-7")
    again = await pub.publish("k", {"a": 2}, idempotency_id="order-7")
    assert not first.deduplicated and again.deduplicated
    assert again.record_id == first.record_id
    assert await stack.redis.xlen(first.stream_key) == 1
    with pytest.raises(ValueError, match="idempotency_id"):
        await pub.publish("k", {"a": 1}, idempotency_id="")


@standalone
async def test_dedup_record_is_bounded_by_count(stack: Stack) -> None:
    await stack.create_group(1)
    pub = stack.publisher(idempotent=PublishIdempotence(max_ids=10))
    for i in range(30):
        await pub.publish("k", {"a": i})
    key = stack.key(0)
    assert await stack.redis.zcard(slot_key(key, "idem:order")) == 10
    assert await stack.redis.hlen(slot_key(key, "idem")) == 10
    # The oldest ids were forgotten: publishing one again appends a copy.
    again = await pub.publish("k", {"a": 0}, idempotency_id=f"{pub.idempotence.producer_id}:1")
    assert not again.deduplicated


@standalone
async def test_dedup_window_expires_ids(stack: Stack) -> None:
    await stack.create_group(1)
    pub = stack.publisher(idempotent=PublishIdempotence(window=0.05))
    first = await pub.publish("k", {"a": 1}, idempotency_id="x")
    await anyio.sleep(0.1)
    later = await pub.publish("k", {"a": 1}, idempotency_id="x")
    assert not later.deduplicated and later.record_id != first.record_id


@standalone
async def test_no_idmp_on_this_server_falls_back_to_the_script(stack: Stack) -> None:
    # Redis < 8.6 answers XADD ... IDMP with a syntax error: the script is used.
    info = await stack.redis.info("server")
    major, minor = (int(x) for x in str(info["redis_version"]).split(".")[:2])
    assert await supports_idmp(stack.redis) is ((major, minor) >= (8, 6))
    pub = await stack.started_publisher(1, idempotent=True)
    assert pub.idempotence is not None and pub.idempotence.native is False


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="window"):
        PublishIdempotence(window=0)
    with pytest.raises(ValueError, match="max_ids"):
        PublishIdempotence(max_ids=0)
    with pytest.raises(ValueError, match="producer_id"):
        PublishIdempotence(producer_id="a:b")
