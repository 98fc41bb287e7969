"""``streamkit-server`` / ``python -m streamkit_server``.

Every setting is an environment variable ``STREAMKIT_SERVER_<NAME>`` and a flag
``--<name>`` (flags win).  Start-up fails fast, with one line on stderr and
exit status 1, when Redis is unreachable or lacks a command we rely on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import logging
import re
import secrets
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any, Final

import uvicorn
from pydantic import ValidationError
from redis.exceptions import RedisError
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from streamkit.connections import redacted_url
from streamkit.version import package_version
from streamkit_server.api import create_app
from streamkit_server.api.guards import guarded_protocol
from streamkit_server.auth.principals import hash_password
from streamkit_server.auth.token_versions import revoke
from streamkit_server.coordination.timings import TimingConflict, Timings
from streamkit_server.runtime import Runtime, make_redis_client
from streamkit_server.settings import ServerSettings

__all__ = ["main", "parse_settings", "preflight"]

log = logging.getLogger("streamkit_server")

# The drain proof of a scale-in needs the consumer-group ``lag`` that
# XINFO GROUPS reports from Redis 7.0 on; without it no removed shard could
# ever be proven drained, so older servers are refused at start-up.
_MIN_REDIS: Final = (7, 0)
_REQUIRED_COMMANDS: Final = (
    "XAUTOCLAIM", "XINFO", "XGROUP", "XREADGROUP", "XACK", "XADD", "XRANGE", "XREVRANGE",
    "EVALSHA", "SCRIPT", "HSTRLEN", "MEMORY",
)  # fmt: skip


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")


def _plain(markdown: str) -> str:
    """A setting's description (markdown, shared with docs/operations.md) for a terminal."""
    return _LINK.sub(r"\1", markdown).replace("`", "")


def option_help(name: str) -> str:
    """The ``--help`` line of a setting: what it does, its variable and its default."""
    field = ServerSettings.model_fields[name]
    default: Any = field.default
    if default is None:
        generated = name in {"admin_password", "token_secret"}
        default = "generated at start-up" if generated else "none"
    elif isinstance(default, bool):
        default = str(default).lower()
    where = f"env STREAMKIT_SERVER_{name.upper()}; default {default}"
    return f"{_plain(field.description or '')} ({where})"


def _metavar(name: str, annotation: Any) -> str:
    if annotation is bool:
        return "BOOL"
    if name.endswith("_ms"):
        return "MS"
    if annotation is int:
        return "N"
    return {"url": "URL", "file": "PATH", "host": "HOST"}.get(name.rsplit("_", 1)[-1], "TEXT")


def parse_settings(argv: Sequence[str] | None = None) -> ServerSettings:
    parser = argparse.ArgumentParser(
        prog="streamkit-server",
        description="Run the streamkit coordinator (KIP-848-style, sharded Redis Streams).",
        epilog="Every option is also an environment variable; flags win. The settings table "
        "of the operations guide (docs/operations.md) has the same texts. Subcommands: "
        "streamkit-server hash-password, streamkit-server revoke-tokens USERNAME.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    for name, field in ServerSettings.model_fields.items():
        metavar = _metavar(name, field.annotation)
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if field.annotation is bool else {}
        parser.add_argument(
            _flag(name), dest=name, default=None, metavar=metavar, help=option_help(name), **extra
        )
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if v is not None}
    return ServerSettings(**overrides)


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


def _hash_password() -> int:
    """``streamkit-server hash-password``: a hash for a principals document."""
    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline()
    password = password.rstrip("\n")
    if not password.strip():
        print("streamkit-server: the password must not be blank", file=sys.stderr)
        return 2
    print(hash_password(password))
    return 0


async def _revoke(settings: ServerSettings, username: str) -> int:
    client = make_redis_client(settings)
    try:
        return await revoke(client, settings.key_prefix, username)
    finally:
        await client.aclose()


def _revoke_tokens(argv: Sequence[str]) -> int:
    """``streamkit-server revoke-tokens USER [settings flags]``: on every process at once."""
    if not argv or argv[0].startswith("-"):
        print("usage: streamkit-server revoke-tokens USERNAME [--redis-url ...]", file=sys.stderr)
        return 2
    try:
        settings = parse_settings(argv[1:])
        version = asyncio.run(_revoke(settings, argv[0]))
    except (ValidationError, RedisError, OSError) as exc:
        print(f"streamkit-server: cannot revoke: {type(exc).__name__}", file=sys.stderr)
        return 1
    print(f"revoked the tokens of {argv[0]!r} (token version now {version})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["hash-password"]:
        return _hash_password()
    if args[:1] == ["revoke-tokens"]:
        return _revoke_tokens(args[1:])
    try:
        settings = parse_settings(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        where = f"invalid setting {field}" if field else "invalid settings"
        print(f"streamkit-server: {where}: {message}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if settings.admin_password is not None:
        password = settings.admin_password.get_secret_value()
    else:
        password = secrets.token_urlsafe(18)
        print(
            f"streamkit-server: generated admin password for user "
            f"{settings.admin_username!r}: {password} "
            "(set STREAMKIT_SERVER_ADMIN_PASSWORD to choose one)",
            flush=True,
        )
    secret: bytes | None = None
    if settings.token_secret is not None:
        secret = settings.token_secret.get_secret_value().encode()
    else:
        log.info(
            "STREAMKIT_SERVER_TOKEN_SECRET is not set: bearer tokens are signed with the "
            "secret shared through Redis (created once, used by every coordinator process)"
        )
    if settings.insecure_member_api:
        log.warning(
            "INSECURE: --insecure-member-api is on; anyone who reaches this port can "
            "heartbeat, join or leave for any member id. Use it for local development only"
        )
    problem = asyncio.run(preflight(settings))
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
