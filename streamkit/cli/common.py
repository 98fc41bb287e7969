"""What every command shares: exit statuses, ``error:`` lines, logging, settings.

Exit statuses: 0 done; 1 the command started and then failed (an unexpected
error, dead letters that could not be replayed); 2 it could not start: a bad
flag, setting or target, or a service it needs that is missing or refuses.
A status 2 always comes with one ``error:`` line that names what to change.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from streamkit.settings import StreamKitSettings

__all__ = [
    "EXIT_FAILED",
    "EXIT_USAGE",
    "LOG_LEVELS",
    "CoordinatorPortOption",
    "RedisClusterOption",
    "RedisUrlOption",
    "check_log_level",
    "configure_logging",
    "debug_enabled",
    "fail",
    "load_settings",
    "run_async",
    "until_interrupted",
]

T = TypeVar("T")

#: The command could not start (one ``error:`` line names the fix).
EXIT_USAGE = 2
#: It started and failed.
EXIT_FAILED = 1
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")

# The options of the commands that run services locally (demo, dev): one
# spelling of each flag and its help (streamkit.demo.services.LocalServices).
RedisUrlOption = Annotated[
    str | None, typer.Option(help="Use this Redis instead of a private redis-server.")
]
RedisClusterOption = Annotated[bool, typer.Option(help="--redis-url is a cluster node.")]
CoordinatorPortOption = Annotated[
    int | None, typer.Option(min=1, max=65535, help="Coordinator port (default: a free one).")
]


def debug_enabled() -> bool:
    """``STREAMKIT_DEBUG=1`` (or ``streamkit -v``): show tracebacks."""
    return os.environ.get("STREAMKIT_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    from streamkit.cli.output import echo

    echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def check_log_level(level: str) -> str:
    if level.lower() not in LOG_LEVELS:
        fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    return level.lower()


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=check_log_level(level).upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if level.lower() != "debug":
        # One line per heartbeat request would drown everything else.
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)


def load_settings(*, quiet: bool = False) -> StreamKitSettings:
    """``STREAMKIT_*`` settings; an invalid one raises ``SettingsError`` (one line).

    ``quiet``: a command that prints its own outcome logs errors only, so a
    client's warning (a refused login) does not repeat its ``error:`` line.
    """
    from streamkit.settings import StreamKitSettings

    if quiet:
        logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    return StreamKitSettings()


def run_async(work: Callable[[], Awaitable[T]]) -> T:
    """``anyio.run(work)``; errors propagate to ``main``, which prints them as one line."""
    import anyio

    return anyio.run(work)


async def until_interrupted(work: Callable[[], Awaitable[object]]) -> bool:
    """Run ``work`` until it returns or Ctrl-C / SIGTERM arrives; True if interrupted.

    The signal cancels an anyio cancel scope rather than the main task:
    a scope's cancellation is delivered again at every await, so no library
    below (an HTTP pool shielding its clean-up) can swallow it the way it can
    swallow asyncio's one-shot ``task.cancel()`` on Ctrl-C.
    """
    import signal

    import anyio

    interrupted = False
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

            async def stop() -> None:
                nonlocal interrupted
                async for _ in signals:
                    interrupted = True
                    tg.cancel_scope.cancel()

            tg.start_soon(stop)
            await work()
            tg.cancel_scope.cancel()
    return interrupted
