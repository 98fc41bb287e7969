"""A hostile or broken coordinator cannot drive the terminal through the CLI,
nor exhaust its memory: escapes in ids and messages are printed as text, and
an oversized answer is refused after a bounded read.

The "coordinator" here is a raw HTTP server in the test's event loop; the CLI
runs as a real subprocess, as a person would run it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
from anyio.abc import SocketStream

from streamkit.cli.output import printable
from streamkit.coordinator_client import AnswerTooLarge, CoordinatorClient

EVIL = "m\x1b]0;owned\x07\x1b[2J\x9b31m\u202egnp.exe\r\nerror: fake"

Answer = Callable[[str], tuple[int, bytes]]


@asynccontextmanager
async def _server(answer: Answer) -> AsyncIterator[str]:
    """An HTTP/1.1 server answering each request with ``answer(path)``."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")

    async def serve(stream: SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive()
                data += chunk
            path = data.split(b" ", 2)[1].decode()
            status, body = answer(path)
            head = (
                f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            )
            try:
                await stream.send(head.encode() + body)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the client stopped reading (an oversized answer)

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)  # type: ignore[attr-defined]
        yield f"http://127.0.0.1:{port}"
        tg.cancel_scope.cancel()


def _hostile(path: str) -> tuple[int, bytes]:
    if "/offsets" in path:
        shard = {"shard": {"shardIndex": 0}, "streamKey": EVIL, "ownerMemberIds": [EVIL],
                 "streamLength": 1, "pendingCount": 0, "lag": 0}  # fmt: skip
        return 200, json.dumps({"shards": [shard]}).encode()
    if "/members" in path:
        member = {"memberId": EVIL, "memberName": EVIL, "state": "ACTIVE", "memberEpoch": 3}
        return 200, json.dumps({"members": [member]}).encode()
    group = {"streamPrefix": "orders", "consumerGroup": "billing", "state": "STABLE",
             "groupEpoch": 1, "assignmentEpoch": 1, "metadataVersion": 1,
             "shardCount": 1}  # fmt: skip
    return 200, json.dumps(group).encode()


async def _cli(url: str, *args: str) -> tuple[int, str, str]:
    env = {"STREAMKIT_COORDINATOR_URL": url, "PATH": "/usr/bin:/bin", "NO_COLOR": "1"}
    done = await anyio.run_process([sys.executable, "-m", "streamkit", *args], env=env, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def _controls(text: str) -> list[str]:
    allowed = {"\n"}
    return [c for c in text if c not in allowed and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F
            or c in "\u202e\u2028\u2029")]  # fmt: skip


def test_printable_escapes_every_control_and_keeps_text() -> None:
    assert printable("café ✓ shard-7") == "café ✓ shard-7"
    assert printable(EVIL) == (
        "m\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202egnp.exe\\x0d\\x0aerror: fake"
    )


async def test_status_prints_hostile_ids_as_text() -> None:
    async with _server(_hostile) as url:
        code, out, err = await _cli(url, "status", "orders", "billing")
    assert code == 0, err
    assert "m\\x1b]0;owned" in out, out
    assert _controls(out) == [] and _controls(err) == []
    # The fake line stays inside the record that carried it.
    assert not any(line.startswith("error: fake") for line in out.splitlines())


def test_json_output_escapes_controls_and_stays_json(capsys: pytest.CaptureFixture[str]) -> None:
    from streamkit.cli.output import echo_json

    echo_json({"memberId": EVIL})
    out = capsys.readouterr().out
    assert _controls(out) == []
    assert json.loads(out) == {"memberId": EVIL}


async def test_an_error_message_cannot_reach_the_terminal_raw() -> None:
    def refuse(path: str) -> tuple[int, bytes]:
        body = {"status": "404", "errorCode": "GROUP_NOT_FOUND", "message": EVIL}
        return 404, json.dumps(body).encode()

    async with _server(refuse) as url:
        code, out, err = await _cli(url, "group", "list")
    assert code != 0
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert _controls(out + err) == []


async def test_an_oversized_answer_is_refused_after_a_bounded_read() -> None:
    huge = b'{"groups": [' + b'"x",' * (5 * 1024 * 1024) + b'"x"]}'  # about 20 MiB

    async with _server(lambda path: (200, huge)) as url:
        async with CoordinatorClient(url, max_answer_bytes=1024 * 1024) as client:
            with pytest.raises(AnswerTooLarge, match="over 1 MiB"):
                await client.list_groups()
        code, _, err = await _cli(url, "group", "list")
    assert code != 0 and "over 16 MiB" in err, err


async def test_a_server_that_is_not_a_coordinator_is_named_as_such() -> None:
    # A 404 page of some other server is not "no such group" (which would send
    # the user off to create one), and its HTML never reaches the terminal.
    page = b"<!DOCTYPE html>\n<html><body>\n<h1>Not Found</h1>\n</body></html>\n"

    async with _server(lambda path: (404, page)) as url:
        for args in (["status", "orders", "billing"], ["publish", "orders", "billing", "k", "a=1"]):
            code, _, err = await _cli(url, *args)
            assert code == 2, err
            assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
            assert "not a streamkit coordinator" in err and "STREAMKIT_COORDINATOR_URL" in err
            assert "no consumer group" not in err and "<html>" not in err, err
