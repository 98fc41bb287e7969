"""``streamkit demo``: the whole system on one machine, live (see ``streamkit.demo``)."""

from __future__ import annotations

from typing import Annotated

import typer

from streamkit.cli.common import configure_logging

__all__ = ["demo"]


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
    idempotent: Annotated[
        bool,
        typer.Option(
            help="Idempotent publishes and billing (markers + staged effects): duplicates=0."
        ),
    ] = False,
) -> None:
    """Run Redis, a coordinator, consumers and a publisher locally, live."""
    # Imported here: the demo needs the server extra and a source checkout.
    from streamkit.demo.run import DemoOptions
    from streamkit.demo.run import run as run_demo

    configure_logging("warning")
    options = DemoOptions(
        duration=duration,
        redis_url=redis_url,
        redis_cluster=redis_cluster,
        shards=shards,
        scale_to=scale_to,
        rate=rate,
        console=console,
        port=port,
        idempotent=idempotent,
    )
    raise typer.Exit(run_demo(options))
