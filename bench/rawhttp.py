"""A minimal HTTP/1.1 client for benchmarks: keep-alive, pipelined, raw bytes.

httpx costs the client more CPU per request than the coordinator spends
answering it; on a shared 2-core machine the client then sets the pace.  This
one writes pre-encoded requests and reads answers by Content-Length, nothing
else (no redirects, no chunked bodies: the coordinator sends neither).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re

from streamkit.protocol import API_PREFIX

__all__ = ["Pipe", "auth_head", "basic_head", "bearer_head", "login", "request_bytes"]

_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)


class Pipe:
    """One keep-alive HTTP/1.1 connection that sends requests in pipelined batches."""

    def __init__(
        self, url: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.url, self.reader, self.writer = url, reader, writer

    @classmethod
    async def open(cls, url: str) -> Pipe:
        host, port = url.removeprefix("http://").split(":")
        return cls(url, *await asyncio.open_connection(host, int(port)))

    async def exchange(self, requests: list[bytes]) -> list[tuple[int, bytes]]:
        """Answers in order; once more on a new connection if the server closed this one
        (uvicorn closes connections idle for 5 s: a client waiting for the others)."""
        try:
            return await self._exchange(requests)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.close()
            fresh = await Pipe.open(self.url)
            self.reader, self.writer = fresh.reader, fresh.writer
            return await self._exchange(requests)

    async def _exchange(self, requests: list[bytes]) -> list[tuple[int, bytes]]:
        self.writer.write(b"".join(requests))
        answers = []
        for _ in requests:
            head = await self.reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            match = _LENGTH.search(head)
            body = await self.reader.readexactly(int(match.group(1))) if match else b""
            answers.append((status, body))
        return answers

    def close(self) -> None:
        self.writer.close()


def request_bytes(method: str, path: str, head: bytes, body: bytes = b"") -> bytes:
    """One request, ``head`` being its header lines (each ending in CRLF)."""
    length = f"Content-Length: {len(body)}\r\n" if body or method != "GET" else ""
    return f"{method} {path} HTTP/1.1\r\n".encode() + head + f"{length}\r\n".encode() + body


def basic_head(auth: tuple[str, str]) -> bytes:
    """Header lines of a JSON request with Basic credentials."""
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    lines = f"Host: bench\r\nAuthorization: Basic {token}\r\nContent-Type: application/json\r\n"
    return lines.encode()


def bearer_head(token: str) -> bytes:
    """Header lines of a JSON request with a Bearer token."""
    lines = f"Host: bench\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n"
    return lines.encode()


async def login(url: str, auth: tuple[str, str]) -> str:
    """A Bearer token for ``auth`` from the coordinator's login endpoint."""
    body = json.dumps({"username": auth[0], "password": auth[1]}).encode()
    head = b"Host: bench\r\nContent-Type: application/json\r\n"
    pipe = await Pipe.open(url)
    try:
        ((status, answer),) = await pipe.exchange(
            [request_bytes("POST", f"{API_PREFIX}/auth/login", head, body)]
        )
    finally:
        pipe.close()
    if status != 200:
        raise RuntimeError(f"login failed: HTTP {status}: {answer[:200]!r}")
    token: str = json.loads(answer)["accessToken"]
    return token


async def auth_head(url: str, auth: tuple[str, str], scheme: str) -> bytes:
    """Header lines for ``scheme``: "bearer" logs in once, as streamkit clients
    do (``streamkit.coordinator_client``); "basic" sends the password every time."""
    if scheme == "basic":
        return basic_head(auth)
    return bearer_head(await login(url, auth))
