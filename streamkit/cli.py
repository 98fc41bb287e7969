"""The ``streamkit`` command: ``streamkit run module:app``."""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import anyio
import anyio.abc
import typer
from redis.exceptions import RedisError
from rich.console import Console

from streamkit.app import StreamKit
from streamkit.connections import AsyncRedis, connect_redis
from streamkit.consumer.runtime import GroupNotFoundError
from streamkit.coordinator_client import CoordinatorClient, CoordinatorError
from streamkit.errors import StreamkitError, first_leaf
from streamkit.group_hints import existing_groups_hint
from streamkit.observability.probes import instrument, parse_address, serve_probes
from streamkit.settings import StreamKitSettings
from streamkit.status import GroupStatus, fetch_status, plain_lines, render
from streamkit.version import package_version

__all__ = ["cli", "load_app", "main"]

log = logging.getLogger("streamkit.cli")
T = TypeVar("T")

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
    if module_name.endswith(".py") or "/" in module_name:
        # A file name, as for `python myapp.py`: say which import path it means.
        dotted = module_name.removesuffix(".py").strip("./").replace("/", ".")
        raise TargetError(
            f"{target!r} is a file name; name the module and its app instead: "
            f"streamkit run {dotted}:{attribute}"
        )
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


def _version(value: bool) -> None:
    if value:
        typer.echo(f"streamkit {package_version()}")
        raise typer.Exit()


@cli.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """streamkit: sharded Redis Streams with a coordinator."""


@cli.command()
def run(
    target: Annotated[
        str,
        typer.Argument(
            help="The app to run: 'module:attribute', or 'module' for the attribute 'app' "
            "(myapp.py in the current directory is 'myapp:app').",
        ),
    ],
    workers: Annotated[
        int, typer.Option(min=1, help="OS processes, each running the app with its own members.")
    ] = 1,
    log_level: Annotated[
        str, typer.Option(help="critical, error, warning, info or debug.")
    ] = "info",
    http: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT for /healthz, /readyz and /metrics (default: STREAMKIT_HTTP; "
            "off when empty)."
        ),
    ] = None,
) -> None:
    """Serve every listener of the app until SIGINT/SIGTERM, then drain and leave."""
    if log_level.lower() not in _LOG_LEVELS:
        _fail(f"--log-level must be one of {', '.join(_LOG_LEVELS)}", EXIT_BAD_TARGET)
    _configure_logging(log_level)
    if workers > 1:
        if http or (http is None and os.environ.get("STREAMKIT_HTTP")):
            _fail("--http serves one process: use it with --workers 1", EXIT_BAD_TARGET)
        raise typer.Exit(anyio.run(_supervise, target, workers, log_level))
    try:
        app = load_app(target)
    except TargetError as exc:
        _fail(str(exc), EXIT_BAD_TARGET)
    address = app.settings.http if http is None else http
    probe: tuple[str, int] | None = None
    if address:
        try:
            probe = parse_address(address)
        except ValueError as exc:
            _fail(f"--http: {exc}", EXIT_BAD_TARGET)
    try:
        anyio.run(_serve, app, probe)
    except StreamkitError as exc:
        _fail(str(exc), 1)
    except KeyboardInterrupt:  # a signal before the handlers were installed
        raise typer.Exit(130) from None


async def _serve(app: StreamKit, probe: tuple[str, int] | None = None) -> None:
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_forward_signals, app)
            if probe is not None:
                registry = _metrics_registry(app)
                await tg.start(functools.partial(serve_probes, app, *probe, registry=registry))
            await app.serve(freeze_heap=app.settings.gc_freeze)
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # Report a start-up failure (unknown group, ...) as itself, not as a
        # task group traceback.
        leaf = first_leaf(group, StreamkitError)
        if leaf is not None:
            raise leaf from None
        raise


def _metrics_registry(app: StreamKit) -> Any:
    """The registry /metrics serves; None without prometheus-client (probes still work)."""
    try:
        return instrument(app)
    except ImportError:
        log.warning("prometheus-client is not installed: /metrics is off (streamkit[metrics])")
        return None


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
def status(
    stream_prefix: Annotated[str, typer.Argument(help="The stream, e.g. 'greetings'.")],
    group: Annotated[str, typer.Argument(help="The consumer group, e.g. 'printer'.")],
) -> None:
    """Show a group's shards (owner, length, lag, pending) and members.

    Uses the STREAMKIT_COORDINATOR_* settings; the credentials need the READ role.
    """
    try:
        settings = StreamKitSettings()
    except ValueError as exc:
        _fail(str(exc), 2)
    try:
        found = anyio.run(_fetch_status, settings, stream_prefix, group)
    except StreamkitError as exc:
        _fail(str(exc), 1)
    console = Console()
    if console.is_terminal:
        console.print(render(found))
    else:
        for line in plain_lines(found):
            typer.echo(line)


async def _fetch_status(settings: StreamKitSettings, stream_prefix: str, group: str) -> GroupStatus:
    async with CoordinatorClient.from_settings(settings) as client:
        try:
            return await fetch_status(client, stream_prefix, group)
        except CoordinatorError as exc:
            if exc.status_code != 404:
                raise
            hint = await existing_groups_hint(client, stream_prefix, group)
            raise GroupNotFoundError(stream_prefix, group, settings.coordinator_url, hint) from None


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
    from streamkit.demo.run import DemoOptions
    from streamkit.demo.run import run as run_demo

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


dlq = typer.Typer(
    name="dlq",
    help="List and replay a consumer group's dead-letter stream.",
    no_args_is_help=True,
)
cli.add_typer(dlq)

_PrefixArg = Annotated[str, typer.Argument(help="The stream prefix, e.g. 'orders'.")]
_GroupArg = Annotated[str, typer.Argument(help="The consumer group whose dead letters these are.")]
_StreamOpt = Annotated[
    str | None,
    typer.Option("--stream", help="The dead-letter stream key (default: PREFIX:dlq:GROUP)."),
]
_CountOpt = Annotated[int, typer.Option(min=1, help="At most this many, oldest first.")]
_IdsOpt = Annotated[
    list[str] | None, typer.Option("--id", help="Only this dead letter (repeatable).")
]


@dlq.command("list")
def dlq_list(
    stream_prefix: _PrefixArg,
    group: _GroupArg,
    stream: _StreamOpt = None,
    count: _CountOpt = 100,
    ids: _IdsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Show dead letters: where they came from, attempts, error, fields."""
    import json

    from streamkit.consumer.dead_letter import read_dead_letters
    from streamkit.consumer.failure import dead_letter_key

    key = stream or dead_letter_key(stream_prefix, group)

    async def work() -> None:
        async with _redis() as redis:
            letters = await read_dead_letters(redis, key, count=count, ids=ids or ())
        for letter in letters:
            data = letter.as_json()
            if as_json:
                typer.echo(json.dumps(data, ensure_ascii=False))
            else:
                typer.echo(
                    f"{data['id']}  {data['originalStream']}/{data['originalId']}  "
                    f"attempts={data['attempts']}  {data['error']}"
                )
        if not letters and not as_json:
            typer.echo(f"no dead letters in {key}", err=True)

    _run_command(work)


@dlq.command("replay")
def dlq_replay(
    stream_prefix: _PrefixArg,
    group: _GroupArg,
    stream: _StreamOpt = None,
    count: _CountOpt = 100,
    ids: _IdsOpt = None,
    key_field: Annotated[
        str | None, typer.Option(help="Entry field holding the partition key: route by it.")
    ] = None,
    payload_key: Annotated[
        str | None,
        typer.Option(help="Key of the JSON 'payload' field holding the partition key."),
    ] = None,
    keep: Annotated[bool, typer.Option(help="Keep the dead letters after replaying.")] = False,
) -> None:
    """Publish dead letters again (original fields only), then delete them.

    With --key-field or --payload-key the partition key is routed with the
    current routing (through the coordinator); without, each goes back to its
    original shard stream.  Every group reading the stream sees the replay.
    """
    from streamkit.consumer.dead_letter import read_dead_letters, replay
    from streamkit.consumer.failure import dead_letter_key
    from streamkit.publisher.publisher import Publisher
    from streamkit.settings import StreamKitSettings

    if key_field and payload_key:
        _fail("give --key-field or --payload-key, not both", EXIT_BAD_TARGET)
    key = stream or dead_letter_key(stream_prefix, group)

    async def work() -> int:
        async with _redis() as redis:
            letters = await read_dead_letters(redis, key, count=count, ids=ids or ())
            if key_field or payload_key:
                async with Publisher(
                    stream_prefix, group, settings=StreamKitSettings(), redis=redis
                ) as publisher:
                    outcomes = await replay(
                        redis,
                        key,
                        letters,
                        publish=publisher.publish,
                        key_field=key_field,
                        payload_key=payload_key,
                        delete=not keep,
                    )
            else:
                outcomes = await replay(redis, key, letters, delete=not keep)
        failed = 0
        for outcome in outcomes:
            if outcome.to is None:
                failed += 1
                typer.echo(f"{outcome.letter.id}  not replayed: {outcome.error}", err=True)
            else:
                typer.echo(f"{outcome.letter.id}  -> {outcome.to}")
        return 1 if failed else 0

    raise typer.Exit(_run_command(work))


@contextlib.asynccontextmanager
async def _redis() -> AsyncIterator[AsyncRedis]:
    from streamkit.settings import StreamKitSettings

    settings = StreamKitSettings()
    redis = connect_redis(settings.redis_url, cluster=settings.redis_cluster)
    try:
        yield redis
    finally:
        await redis.aclose()


def _run_command(work: Callable[[], Awaitable[T]]) -> T:
    try:
        return anyio.run(work)
    except (RedisError, OSError, StreamkitError) as exc:
        _fail(str(exc) or repr(exc), 1)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
