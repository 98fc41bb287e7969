"""The ``streamkit`` command: ``streamkit run module:app``."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import anyio
import anyio.abc
import typer

from streamkit.app import StreamKit
from streamkit.errors import StreamkitError

__all__ = ["cli", "load_app", "main"]

log = logging.getLogger("streamkit.cli")

cli = typer.Typer(
    name="streamkit",
    help="Run streamkit applications.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

#: Exit status for a bad ``module:attribute`` (like a usage error).
EXIT_BAD_TARGET = 2
_LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class TargetError(Exception):
    """``module:app`` does not name a StreamKit app."""


def load_app(target: str) -> StreamKit:
    """Import ``module:attribute`` (the current directory is importable)."""
    module_name, _, attribute = target.partition(":")
    attribute = attribute or "app"
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise TargetError(f"{target!r} is not an import path; expected 'module:app'")
    if str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing *target* is a bad path; a missing import inside the
        # module is a bug in it and deserves its traceback.
        if exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + ".")
        ):
            raise TargetError(f"cannot import module {module_name!r}: {exc}") from None
        raise
    app = module
    for part in attribute.split("."):
        try:
            app = getattr(app, part)
        except AttributeError:
            raise TargetError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(app, StreamKit):
        raise TargetError(
            f"{target!r} is a {type(app).__name__}, not a streamkit.StreamKit application"
        )
    return app


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if level.lower() != "debug":
        # One line per heartbeat request would drown everything else.
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@cli.callback()
def _root() -> None:
    """streamkit: sharded Redis Streams with a coordinator."""


@cli.command()
def run(
    target: Annotated[str, typer.Argument(help="The app to run, as 'module:attribute'.")],
    workers: Annotated[
        int, typer.Option(min=1, help="OS processes, each running the app with its own members.")
    ] = 1,
    log_level: Annotated[
        str, typer.Option(help="critical, error, warning, info or debug.")
    ] = "info",
) -> None:
    """Serve every listener of the app until SIGINT/SIGTERM, then drain and leave."""
    if log_level.lower() not in _LOG_LEVELS:
        _fail(f"--log-level must be one of {', '.join(_LOG_LEVELS)}", EXIT_BAD_TARGET)
    _configure_logging(log_level)
    if workers > 1:
        raise typer.Exit(anyio.run(_supervise, target, workers, log_level))
    try:
        app = load_app(target)
    except TargetError as exc:
        _fail(str(exc), EXIT_BAD_TARGET)
    try:
        anyio.run(_serve, app)
    except StreamkitError as exc:
        _fail(str(exc), 1)
    except KeyboardInterrupt:  # a signal before the handlers were installed
        raise typer.Exit(130) from None


async def _serve(app: StreamKit) -> None:
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_forward_signals, app)
            await app.serve()
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # Report a start-up failure (unknown group, ...) as itself, not as a
        # task group traceback.
        matched, _ = group.split(StreamkitError)
        if matched is not None:
            raise matched.exceptions[0] from None
        raise


async def _forward_signals(app: StreamKit) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        received = 0
        async for signum in signals:
            received += 1
            if received == 1:
                log.info(
                    "%s: draining and leaving (send again to cancel handlers)",
                    signal.Signals(signum).name,
                )
                app.shutdown()
            else:
                log.warning("%s again: cancelling handlers", signal.Signals(signum).name)
                app.shutdown(force=True)


async def _supervise(target: str, workers: int, log_level: str) -> int:
    """``--workers N``: N child processes, each ``streamkit run`` with its own
    member id base ``{base}-w{k}``, so their member ids never collide and stay
    the same across restarts."""
    from streamkit.settings import StreamKitSettings

    try:
        base = StreamKitSettings().member_id_base
    except Exception as exc:  # invalid settings: let the children say so too
        _fail(str(exc), 1)
    processes = []
    for index in range(workers):
        env = dict(os.environ, STREAMKIT_MEMBER_ID_BASE=f"{base}-w{index}")
        processes.append(
            await anyio.open_process(
                [sys.executable, "-m", "streamkit", "run", target, "--log-level", log_level],
                env=env,
                stdin=None,
                stdout=None,
                stderr=None,
                # Own session: a terminal's Ctrl-C reaches only us; we forward
                # one SIGTERM each, so workers drain instead of force-stopping.
                start_new_session=True,
            )
        )
    status = 0
    async with anyio.create_task_group() as tg:

        async def relay() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    for proc in processes:
                        if proc.returncode is None:
                            proc.send_signal(signum if signum == signal.SIGTERM else signal.SIGTERM)

        async def watch(proc: anyio.abc.Process) -> None:
            nonlocal status
            code = await proc.wait()
            if code and not status:
                status = code
                # One worker failed (bad app, unknown group): stop the rest.
                for other in processes:
                    if other.returncode is None:
                        other.terminate()

        tg.start_soon(relay)
        async with anyio.create_task_group() as waiters:
            for proc in processes:
                waiters.start_soon(watch, proc)
        tg.cancel_scope.cancel()
    return status


@cli.command()
def demo(
    duration: Annotated[
        float,
        typer.Option(
            min=5, help="Length of the demo in seconds (publishing stops at 80%, then it drains)."
        ),
    ] = 60.0,
    shards: Annotated[int, typer.Option(min=1, help="Initial shards of the stream.")] = 8,
    scale_to: Annotated[int, typer.Option(min=1, help="Shards after the live reshard.")] = 12,
    rate: Annotated[float, typer.Option(min=1, help="Orders published per second.")] = 400.0,
    redis_url: Annotated[
        str | None, typer.Option(help="Use this Redis instead of a private redis-server.")
    ] = None,
    redis_cluster: Annotated[bool, typer.Option(help="--redis-url is a cluster node.")] = False,
    console: Annotated[
        bool,
        typer.Option(
            "--console",
            help="Watch in the web console: wait for Enter before starting and before cleaning up.",
        ),
    ] = False,
    port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="Coordinator port (default: a free one)."),
    ] = None,
) -> None:
    """Run Redis, a coordinator, consumers and a publisher locally, live."""
    # Imported here: the demo needs the server extra and a source checkout.
    from streamkit.demo import DemoOptions
    from streamkit.demo import run as run_demo

    _configure_logging("warning")
    options = DemoOptions(
        duration=duration,
        redis_url=redis_url,
        redis_cluster=redis_cluster,
        shards=shards,
        scale_to=scale_to,
        rate=rate,
        console=console,
        port=port,
    )
    raise typer.Exit(run_demo(options))


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
