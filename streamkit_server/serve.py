"""Serve the coordinator: what ``streamkit-server`` runs once its settings parse.

Apart from ``streamkit_server.cli`` so that ``--version`` and ``--help`` answer
without importing uvicorn, FastAPI, redis-py and the whole API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
from types import FrameType
from typing import Any, Final

import uvicorn
from redis.exceptions import RedisError
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from streamkit.connections import redacted_url
from streamkit_server.api import create_app
from streamkit_server.api.guards import guarded_protocol
from streamkit_server.auth.token_versions import revoke
from streamkit_server.coordination.timings import TimingConflict, Timings
from streamkit_server.runtime import Runtime, make_redis_client
from streamkit_server.settings import ServerSettings

__all__ = ["preflight", "register_timings", "revoke_tokens", "serve"]

log = logging.getLogger("streamkit_server")

# The drain proof of a scale-in needs the consumer-group ``lag`` that
# XINFO GROUPS reports from Redis 7.0 on; without it no removed shard could
# ever be proven drained, so older servers are refused at start-up.
_MIN_REDIS: Final = (7, 0)
_REQUIRED_COMMANDS: Final = (
    "XAUTOCLAIM", "XINFO", "XGROUP", "XREADGROUP", "XACK", "XADD", "XRANGE", "XREVRANGE",
    "EVALSHA", "SCRIPT", "HSTRLEN", "MEMORY",
)  # fmt: skip


async def preflight(settings: ServerSettings) -> str | None:
    """None when Redis is usable, else the one-line reason it is not."""
    client = make_redis_client(settings)
    # The URL may carry a password: never print it.
    where = f"Redis at {redacted_url(settings.redis_url)}"
    where += " (cluster)" if settings.redis_cluster else ""
    try:
        await asyncio.wait_for(client.ping(), timeout=10)
        info = await client.info("server")
        version_text = str(info.get("redis_version", "0"))
        version = tuple(int(p) for p in version_text.split(".")[:2] if p.isdigit())
        if version < _MIN_REDIS:
            return (
                f"{where} is version {version_text}; streamkit needs Redis >= "
                f"{'.'.join(map(str, _MIN_REDIS))}"
            )
        missing = []
        for command in _REQUIRED_COMMANDS:
            try:
                reply = await client.execute_command("COMMAND", "INFO", command)
            except (TypeError, IndexError):  # redis-py's parser chokes on a nil entry
                reply = None
            if not reply:
                missing.append(command)
        if missing:
            return f"{where} lacks required commands {', '.join(missing)} (renamed or disabled?)"
    except (RedisError, OSError, TimeoutError) as exc:
        return f"{where} is unreachable: {type(exc).__name__}: {exc}"
    finally:
        try:
            await client.aclose()
        except (RedisError, OSError):
            pass
    return None


async def register_timings(settings: ServerSettings, coordinator_id: str) -> str | None:
    """None once this process' timings are registered, else why they are refused.

    Before uvicorn starts, so a conflict is one line rather than a failed
    lifespan; the runtime registers again (a refresh) when it starts.
    """
    client = make_redis_client(settings)
    timings = Timings(client, settings.key_prefix, coordinator_id, settings.coordinator_config())
    try:
        await timings.register_at_start()
    except TimingConflict as exc:
        return str(exc)
    finally:
        with contextlib.suppress(RedisError, OSError):
            await client.aclose()
    return None


class _Server(uvicorn.Server):
    """uvicorn with the terminating sequence of seed 000 in front of its shutdown."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime) -> None:
        super().__init__(config)
        self.runtime = runtime
        self._loop: asyncio.AbstractEventLoop | None = None
        self._terminating = False
        self._terminate_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in _captured_signals on purpose: uvicorn would re-raise
        # it after shutdown and the default SIGTERM action would turn a clean
        # shutdown into exit status -15.
        if self._terminating or self._loop is None:
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True
            return
        self._terminating = True
        self._loop.call_soon_threadsafe(self._start_terminating)

    def _start_terminating(self) -> None:
        self._terminate_task = asyncio.ensure_future(self._terminate())

    async def _terminate(self) -> None:
        settings = self.runtime.settings
        started = time.monotonic()
        self.runtime.begin_terminating()
        await self.runtime.gate.wait_idle(settings.mutex_ttl_ms / 1000)
        # Keep answering 503 COORDINATOR_TERMINATING for the grace period so
        # clients on open connections are told to go elsewhere.
        remaining = settings.shutdown_grace_ms / 1000 - (time.monotonic() - started)
        if remaining > 0:
            await asyncio.sleep(remaining)
        self.should_exit = True


async def revoke_tokens(settings: ServerSettings, username: str) -> int:
    client = make_redis_client(settings)
    try:
        return await revoke(client, settings.key_prefix, username)
    finally:
        await client.aclose()


def _port_taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound, said before anything starts (uvicorn
    would say it only after the lifespan, among its own log lines)."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            # "address already in use" is what streamkit.testing looks for.
            return (
                f"cannot listen on {host}:{port} ({exc.strerror or exc}; another "
                "coordinator?); --port or STREAMKIT_SERVER_PORT chooses another"
            ).replace("Address already in use", "address already in use")
    return None


def serve(settings: ServerSettings, password: str, secret: bytes | None) -> int:
    """Check Redis, register the timings, then serve until a signal; the exit status."""
    problem = _port_taken(settings.host, settings.port) or asyncio.run(preflight(settings))
    if problem is not None:
        print(f"streamkit-server: cannot start: {problem}", file=sys.stderr, flush=True)
        return 1
    app = create_app(settings, admin_password=password, token_secret=secret)
    problem = asyncio.run(register_timings(settings, app.state.runtime.coordinator_id))
    if problem is not None:
        print(f"streamkit-server: cannot start: {problem}", file=sys.stderr, flush=True)
        return 1
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=settings.access_log,
        lifespan="on",
        timeout_graceful_shutdown=max(1, settings.mutex_ttl_ms // 1000 + 5),
        server_header=False,
        # Header size and time bounded whichever parser uvicorn picks (api/guards.py).
        http=guarded_protocol(
            AutoHTTPProtocol, settings.header_timeout_ms / 1000, settings.max_header_bytes
        ),
        h11_max_incomplete_event_size=settings.max_header_bytes,
    )
    server = _Server(config, app.state.runtime)
    server.run()
    return 0 if server.started else 1
