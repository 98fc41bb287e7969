"""``streamkit run``: serve an app's listeners until SIGINT/SIGTERM, then drain."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from streamkit.cli.common import configure_logging, fail, load_settings
from streamkit.cli.target import load_app

if TYPE_CHECKING:
    import anyio.abc

    from streamkit.app import StreamKit

__all__ = ["run", "serve"]

log = logging.getLogger("streamkit.cli")


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
    configure_logging(log_level)
    import anyio

    if workers > 1:
        if http or (http is None and os.environ.get("STREAMKIT_HTTP")):
            fail("--http serves one process: use it with --workers 1")
        raise typer.Exit(anyio.run(_supervise, target, workers, log_level.lower()))
    app = load_app(target)
    raise typer.Exit(serve_until_signalled(app, http))


def serve_until_signalled(app: StreamKit, http: str | None) -> int:
    """Serve ``app`` (with the probe server of ``http`` / ``STREAMKIT_HTTP``);
    the exit status: 0 after a graceful stop, 130 when interrupted early."""
    import anyio

    address = app.settings.http if http is None else http
    probe: tuple[str, int] | None = None
    if address:
        from streamkit.observability.probes import parse_address

        try:
            probe = parse_address(address)
        except ValueError as exc:
            fail(f"--http (or STREAMKIT_HTTP) {address!r}: {exc}")
    try:
        anyio.run(serve, app, probe)
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 130
    return 0


async def serve(app: StreamKit, probe: tuple[str, int] | None = None) -> None:
    """``app.serve()`` with SIGINT/SIGTERM forwarded and the optional probe server."""
    import anyio

    from streamkit.errors import StreamkitError, first_leaf

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_forward_signals, app)
            if probe is not None:
                from streamkit.observability.probes import serve_probes

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
    from streamkit.observability.probes import instrument

    try:
        return instrument(app)
    except ImportError:
        log.warning("prometheus-client is not installed: /metrics is off (streamkit[metrics])")
        return None


async def _forward_signals(app: StreamKit) -> None:
    import anyio

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
    import anyio

    base = load_settings().member_id_base  # invalid settings: one line, before any child
    processes: list[anyio.abc.Process] = []
    for index in range(workers):
        env = dict(os.environ, STREAMKIT_MEMBER_ID_BASE=f"{base}-w{index}")
        processes.append(
            await anyio.open_process(
                [sys.executable, "-m", "streamkit", "run", target, "--log-level", log_level],
                env=env,
                stdin=None,
                stdout=None,
                stderr=subprocess.PIPE,  # relayed: see _relay_stderr
                # Own session: a terminal's Ctrl-C reaches only us; we forward
                # one SIGTERM each, so workers drain instead of force-stopping.
                start_new_session=True,
            )
        )
    status = 0
    printed: set[str] = set()
    async with anyio.create_task_group() as tg:
        for proc in processes:
            tg.start_soon(_relay_stderr, proc, printed)

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

        async with anyio.create_task_group() as forwarding:
            forwarding.start_soon(relay)
            async with anyio.create_task_group() as waiters:
                for proc in processes:
                    waiters.start_soon(watch, proc)
            forwarding.cancel_scope.cancel()
        # The stderr relays end at their worker's end of output; a process the
        # app started and left running could hold the pipe open, so they get
        # two seconds, not forever.
        tg.cancel_scope.deadline = anyio.current_time() + 2
    return status


async def _relay_stderr(proc: anyio.abc.Process, printed: set[str]) -> None:
    """Copy a worker's stderr to ours, line by line, except an ``error:`` line
    another worker already printed: N workers failing the same start-up check
    say it once, not N times."""
    from anyio.streams.text import TextReceiveStream

    assert proc.stderr is not None
    pending = ""
    async for chunk in TextReceiveStream(proc.stderr, errors="replace"):
        pending += chunk
        *lines, pending = pending.split("\n")
        for line in lines:
            if line.startswith("error: "):
                if line in printed:
                    continue
                printed.add(line)
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
    if pending:
        sys.stderr.write(pending + "\n")
