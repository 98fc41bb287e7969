"""``streamkit status STREAM GROUP [--watch]``: one group as the coordinator sees it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer

from streamkit.cli.common import load_settings, run_async, until_interrupted
from streamkit.cli.output import echo

if TYPE_CHECKING:
    from rich.console import Console

    from streamkit.coordinator_client import CoordinatorClient
    from streamkit.settings import StreamKitSettings
    from streamkit.status import GroupStatus

__all__ = ["status"]


def status(
    stream_prefix: Annotated[str, typer.Argument(help="The stream, e.g. 'greetings'.")],
    group: Annotated[str, typer.Argument(help="The consumer group, e.g. 'printer'.")],
    watch: Annotated[
        bool,
        typer.Option(
            "--watch", "-w", help="Refresh until Ctrl-C: in place in a terminal, else as lines."
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option(min=0.2, help="Seconds between refreshes with --watch.")
    ] = 2.0,
) -> None:
    """Show a group's shards (owner, length, lag, pending) and members.

    Members that left stay listed as departed until the coordinator forgets
    them, 5 minutes after they left.  Uses the STREAMKIT_COORDINATOR_*
    settings; the credentials need the READ role.
    """
    settings = load_settings(quiet=True)
    from rich.console import Console

    console = Console()

    async def work() -> None:
        from streamkit.coordinator_client import CoordinatorClient

        async with CoordinatorClient.from_settings(settings) as client:
            first = await _fetch(client, settings, stream_prefix, group)
            if not watch:
                _show(console, first)
                return
            # Ctrl-C ends --watch: not an error.
            await until_interrupted(
                lambda: _watch(console, client, settings, stream_prefix, group, first, interval)
            )

    try:
        run_async(work)
    except KeyboardInterrupt:  # Ctrl-C before the watch began: not an error either
        pass


async def _fetch(
    client: CoordinatorClient, settings: StreamKitSettings, stream_prefix: str, group: str
) -> GroupStatus:
    from streamkit.coordinator_client import CoordinatorError
    from streamkit.status import fetch_status

    try:
        return await fetch_status(client, stream_prefix, group)
    except CoordinatorError as exc:
        if exc.status_code != 404:
            raise
        from streamkit.consumer.runtime import GroupNotFoundError
        from streamkit.group_hints import existing_groups_hint

        hint = await existing_groups_hint(client, stream_prefix, group)
        raise GroupNotFoundError(stream_prefix, group, settings.coordinator_url, hint) from None


def _show(console: Console, found: GroupStatus) -> None:
    from streamkit.status import plain_lines, render

    if console.is_terminal:
        console.print(render(found))
    else:
        for line in plain_lines(found):
            echo(line)


async def _watch(
    console: Console,
    client: CoordinatorClient,
    settings: StreamKitSettings,
    stream_prefix: str,
    group: str,
    first: GroupStatus,
    interval: float,
) -> None:
    """In a terminal the tables are redrawn in place; otherwise each refresh
    prints its block of lines, every line stamped with the time."""
    import contextlib

    import anyio
    from rich.live import Live

    from streamkit.errors import StreamkitError
    from streamkit.status import headline, plain_lines, render

    found = first
    live = Live(render(found), console=console, auto_refresh=False) if console.is_terminal else None
    with live if live is not None else contextlib.nullcontext():
        while True:
            stamp = time.strftime("%H:%M:%S")
            if live is not None:
                live.update(render(found, head=f"{stamp}  {headline(found)}"), refresh=True)
            else:
                for line in plain_lines(found):
                    echo(f"{stamp} {line}")
            await anyio.sleep(interval)
            try:
                found = await _fetch(client, settings, stream_prefix, group)
            except StreamkitError as exc:  # a coordinator restart: say so, keep watching
                echo(f"{time.strftime('%H:%M:%S')} cannot refresh: {exc}", err=True)
