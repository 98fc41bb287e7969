"""The data plane's Redis plumbing: the fast command packer and the lean pipeline.

The packer must produce exactly what redis-py's packer produces (property
test over the argument types redis-py accepts); the lean pipeline is checked
against a real redis-server: replies in order, an error reply stays with its
command, and a round trip cut by the deadline or by cancellation leaves no
half-read connection in the pool.
"""

from __future__ import annotations

import anyio
import pytest
import redis.asyncio
import redis.exceptions
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection

from streamkit import connections
from streamkit.connections import (
    _pack_python,
    connect_redis,
    pack_command,
    send_command,
    send_commands,
)
from streamkit.testing import RedisServer

arguments = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
)
command_names = st.sampled_from(["XADD", b"XADD", "CONFIG GET", b"CLIENT SETNAME", "x y  z"])


@given(command_names, st.lists(arguments, max_size=12))
def test_packing_matches_redis_py(name: str | bytes, args: list[object]) -> None:
    # redis-py's asyncio Connection packs in Python: the reference for both
    # of ours, hiredis' C packer (when installed) and the pure-Python one.
    connection = Connection()
    expected = b"".join(connection.pack_command(name, *args))
    assert b"".join(pack_command(connection.encoder, (name, *args))) == expected
    if type(name) is str:
        split: tuple[object, ...] = (*name.encode().split(), *args)
    else:
        assert isinstance(name, bytes)
        split = (*name.split(), *args)
    assert b"".join(_pack_python(connection.encoder, split)) == expected


def test_hiredis_packs_when_installed() -> None:
    # The test environment installs hiredis (the server extra): the C path
    # above is the one tested, not only the fallback.
    assert connections._hiredis_pack is not None


@pytest.mark.parametrize("bad", [None, True, object()])
def test_packing_refuses_what_redis_py_refuses(bad: object) -> None:
    connection = Connection()
    with pytest.raises(redis.exceptions.DataError):
        pack_command(connection.encoder, ("SET", "k", bad))


@pytest.mark.redis
async def test_lean_pipeline_keeps_order_and_errors_per_command(redis_server: RedisServer) -> None:
    client = connect_redis(redis_server.url)
    try:
        await client.delete("lean:s", "lean:str")
        await client.set("lean:str", "not a stream")
        replies = await send_commands(
            client,
            [
                ("XADD", "lean:s", "*", "n", 1),
                ("XADD", "lean:str", "*", "n", 2),  # WRONGTYPE: this command only
                ("XADD", "lean:missing", "NOMKSTREAM", "*", "n", 3),  # null reply
                ("XLEN", "lean:s"),
            ],
        )
        assert isinstance(replies[0], bytes) and b"-" in replies[0]
        assert isinstance(replies[1], redis.exceptions.ResponseError)
        assert "WRONGTYPE" in str(replies[1])
        assert replies[2] is None and replies[3] == 1
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            await send_command(client, "XADD", "lean:str", "*", "n", 4)
        assert await send_command(client, "XLEN", "lean:s") == 1
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_a_pipeline_past_its_deadline_fails_and_leaves_no_stale_reply(
    redis_server: RedisServer,
) -> None:
    client = connect_redis(redis_server.url, socket_timeout=0.2)
    admin = connect_redis(redis_server.url)
    try:
        await send_command(client, "SET", "lean:k", "before")
        # Redis answers nothing for 0.6 s: the pipeline's one deadline passes.
        await admin.execute_command("CLIENT", "PAUSE", 600, "ALL")
        with pytest.raises(redis.exceptions.TimeoutError):
            await send_commands(client, [("GET", "lean:k"), ("PING",)])
        await anyio.sleep(0.7)
        # The connection that timed out was dropped: the late "before" reply of
        # the cut pipeline is not read as the answer to a later command.
        await send_command(client, "SET", "lean:k", "after")
        assert await send_command(client, "GET", "lean:k") == b"after"
        assert await send_command(client, "PING") in (True, b"PONG", "PONG")
    finally:
        await client.aclose()
        await admin.aclose()


@pytest.mark.redis
async def test_a_cancelled_pipeline_leaves_no_stale_reply(redis_server: RedisServer) -> None:
    client = connect_redis(redis_server.url)
    admin = connect_redis(redis_server.url)
    try:
        await send_command(client, "SET", "lean:c", "first")
        await admin.execute_command("CLIENT", "PAUSE", 400, "ALL")
        with anyio.move_on_after(0.1) as scope:
            await send_commands(client, [("GET", "lean:c")])
        assert scope.cancelled_caught
        await anyio.sleep(0.5)
        await send_command(client, "SET", "lean:c", "second")
        assert await send_command(client, "GET", "lean:c") == b"second"
    finally:
        await client.aclose()
        await admin.aclose()


@pytest.mark.redis
async def test_a_client_made_elsewhere_works_too(redis_server: RedisServer) -> None:
    # An app may hand the publisher its own client (redis-py's packer, decoded replies).
    client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        replies = await send_commands(client, [("SET", "lean:d", "v"), ("GET", "lean:d")])
        assert replies[1] == "v"
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_a_write_to_a_lost_connection_fails_as_redis_py_fails_it(
    redis_server: RedisServer,
) -> None:
    """The lean pipeline writes without redis-py's per-write timer: a write
    that fails is still redis-py's ``ConnectionError``, the connection is
    dropped, and the next call gets a working one."""
    client = connect_redis(redis_server.url)
    try:
        await send_command(client, "SET", "lean:w", "v")
        (conn,) = client.connection_pool._available_connections  # type: ignore[union-attr]
        conn._writer.transport.abort()  # the socket is gone under the idle connection
        await anyio.sleep(0.05)
        with pytest.raises(redis.exceptions.ConnectionError):
            await send_command(client, "GET", "lean:w")
        assert not conn.is_connected
        assert await send_command(client, "GET", "lean:w") == b"v"
    finally:
        await client.aclose()
