"""Redis connections for the data plane (standalone or Redis Cluster)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeAlias
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio
import redis.exceptions
from redis.asyncio.connection import AbstractConnection

#: Either flavour of redis-py asyncio client; both speak the stream commands we use.
AsyncRedis: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster


#: Defaults for the data plane: a connection that is black-holed (no RST, no
#: answer) fails a command after this long instead of hanging it forever.
#: The poller additionally abandons any read at the end of its lease.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_SOCKET_TIMEOUT_S = 10.0


def connect_redis(
    url: str,
    *,
    cluster: bool = False,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT_S,
    **options: Any,
) -> AsyncRedis:
    """A lazily connecting client: no I/O happens until the first command.

    With ``cluster=True`` the URL names one startup node; the client discovers
    the rest and routes each shard key to the primary owning its slot.
    ``socket_timeout`` must exceed the longest ``BLOCK`` a reader uses.
    """
    options.setdefault("socket_connect_timeout", connect_timeout)
    options.setdefault("socket_timeout", socket_timeout)
    if cluster:
        client = redis.asyncio.RedisCluster.from_url(url, **options)
        # The startup nodes exist (without connections); the nodes discovered
        # later are built from these keyword arguments.
        fast = fast_packing(client.connection_kwargs.get("connection_class", _DEFAULT_CONNECTION))
        client.connection_kwargs["connection_class"] = fast
        client.nodes_manager.connection_kwargs["connection_class"] = fast
        for node in client.nodes_manager.startup_nodes.values():
            node.connection_class = fast  # type: ignore[assignment]  # a subclass
        return client
    standalone = redis.asyncio.Redis.from_url(url, **options)
    pool = standalone.connection_pool  # lazily connecting: no connection exists yet
    pool.connection_class = fast_packing(pool.connection_class)
    return standalone


_DEFAULT_CONNECTION = redis.asyncio.Connection
# connection class -> its fast-packing subclass, made once per class.
_FAST: dict[type, type] = {}


def fast_packing(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` with :func:`pack_command` as its command encoder.

    Every streamkit command (each ``XADD``, ``XREADGROUP``, ``XACK``) is packed
    by the connection; redis-py's packer re-joins its buffer once per argument
    and encodes through a generic encoder, several times the cost of
    :func:`pack_command` for a typical ``XADD`` (docs/performance.md). The class keeps whatever
    transport ``from_url`` chose (TCP, TLS, Unix socket).
    """
    if connection_class in _FAST.values():
        return connection_class
    if connection_class not in _FAST:
        _FAST[connection_class] = type(
            f"FastPacking{connection_class.__name__}",
            (connection_class,),
            {"pack_command": _pack_method},
        )
    return _FAST[connection_class]


_hiredis_pack: Callable[..., bytes] | None
try:
    import hiredis

    _hiredis_pack = hiredis.pack_command
except ImportError:  # pragma: no cover - depends on the installation
    _hiredis_pack = None

_UTF8: Final = frozenset({"utf-8", "utf8", "UTF-8", "UTF8"})


def pack_command(encoder: Any, args: tuple[Any, ...]) -> list[bytes]:
    """RESP-encode one command as one buffer, as redis-py's packer does.

    With hiredis installed (and the client's encoding UTF-8, strict), its C
    packer does it: an ``XACK`` of a read's hundred ids packed in Python was
    a noticeable share of a handled entry's cost.  Without it, exact
    ``str``/``bytes``/``int`` arguments take a fast path; anything else
    (floats, memoryviews, and the types redis-py refuses, such as ``bool`` or
    ``None``) goes through redis-py's encoder, so errors stay redis-py's.
    A first argument with spaces (``"CONFIG GET"``) is split into words.
    """
    head = args[0]
    if type(head) is str and " " in head:
        args = (*head.encode().split(), *args[1:])
    elif type(head) is bytes and b" " in head:
        args = (*head.split(), *args[1:])
    if _hiredis_pack is not None and encoder.encoding_errors == "strict":
        if encoder.encoding in _UTF8:
            try:
                return [_hiredis_pack(args)]
            except TypeError:
                pass  # a type hiredis refuses: redis-py's encoder decides below
    return _pack_python(encoder, args)


def _pack_python(encoder: Any, args: tuple[Any, ...]) -> list[bytes]:
    """``pack_command`` without hiredis (``args`` already split)."""
    encoding, errors = encoder.encoding, encoder.encoding_errors
    pieces = [b"*%d\r\n" % len(args)]
    append = pieces.append
    for arg in args:
        kind = type(arg)
        if kind is str:
            arg = arg.encode(encoding, errors)
        elif kind is int:
            arg = b"%d" % arg
        elif kind is not bytes:
            arg = encoder.encode(arg)
        append(b"$%d\r\n" % len(arg))
        append(arg)
        append(b"\r\n")
    return [b"".join(pieces)]


def _pack_method(self: AbstractConnection, *args: Any) -> list[bytes]:
    return pack_command(self.encoder, args)


async def send_command(client: AsyncRedis, *command: Any) -> Any:
    """Send one command and return Redis's reply (no response callback).

    An error reply raises; see :func:`send_commands` for the rest.
    """
    reply = (await send_commands(client, (command,)))[0]
    if isinstance(reply, redis.exceptions.ResponseError):
        raise reply
    return reply


async def send_commands(client: AsyncRedis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` as one non-transactional pipeline; one reply per command.

    A command's error reply comes back as its exception (``raise_on_error=False``);
    a failure of the whole round trip (connection lost, timeout) raises. On a
    standalone Redis the replies are what Redis sent (no response callbacks),
    which is all an ``XADD`` needs; on a cluster redis-py's callbacks apply, so
    a caller whose command's reply a callback reshapes (``XREADGROUP``) must
    tell the two apart (the poller does).

    On a standalone Redis this is a lean pipeline: one packed write, then the
    replies read under **one** deadline (the client's socket timeout) instead
    of redis-py's timer per reply, a noticeable share of a pipelined
    publish, and without redis-py's per-command bookkeeping. No retry here:
    whether a command of a failed round trip was applied is unknown, so the
    caller decides (redis-py's own retry would resend an ``XADD`` that may
    have been applied). A Redis Cluster goes through redis-py (one pipeline
    per node, in parallel), which follows slot moves.
    """
    if isinstance(client, redis.asyncio.RedisCluster):
        if len(commands) == 1:
            try:
                return [await client.execute_command(*commands[0])]
            except redis.exceptions.ResponseError as exc:
                return [exc]
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return await pipe.execute(raise_on_error=False)
    pool = client.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        if len(commands) == 1:
            packed = b"".join(conn.pack_command(*commands[0]))
        else:
            packed = b"".join([b"".join(conn.pack_command(*command)) for command in commands])
        replies: list[Any] = []
        try:
            async with asyncio.timeout(conn.socket_timeout):
                await _write(conn, packed)
                for _ in commands:
                    try:
                        # inf: no per-reply timer (the deadline above covers all)
                        replies.append(await conn.read_response(timeout=math.inf))
                    except redis.exceptions.ResponseError as exc:
                        replies.append(exc)
        except TimeoutError:
            # Replies still on the wire must never answer a later command.
            await conn.disconnect(nowait=True)
            raise redis.exceptions.TimeoutError(
                f"Timeout reading pipeline replies from {redis_address(client)}"
            ) from None
        except BaseException:
            await conn.disconnect(nowait=True)  # never reuse a half-read connection
            raise
        return replies
    finally:
        await pool.release(conn)


async def _write(conn: AbstractConnection, packed: bytes) -> None:
    """``conn.send_packed_command(packed)`` without its own write timer.

    redis-py bounds each write with ``asyncio.wait_for``, which on Python
    3.11 wraps the write in a task of its own: a seventh of a single
    publish's CPU in a profile. :func:`send_commands` already bounds the whole
    round trip with one deadline, so a connected connection without health
    checks is written to directly; anything else takes redis-py's path.
    """
    writer = getattr(conn, "_writer", None)
    if writer is None or conn.health_check_interval:
        await conn.send_packed_command(packed)
        return
    try:
        writer.write(packed)
        await writer.drain()
    except OSError as exc:  # what redis-py turns such a failure into
        raise redis.exceptions.ConnectionError(f"Error while writing to socket: {exc}") from exc


def redacted_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, fit for a log line."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def redis_address(client: AsyncRedis) -> str:
    """Where ``client`` connects (``host:port/db``, never a password), for messages."""
    if isinstance(client, redis.asyncio.RedisCluster):
        nodes = client.nodes_manager.startup_nodes
        return "cluster " + ", ".join(sorted(nodes)) if nodes else "cluster"
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
