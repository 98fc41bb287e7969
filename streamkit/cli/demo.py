"""``streamkit demo``: the whole system on one machine, live (see ``streamkit.demo``)."""

from __future__ import annotations

from typing import Annotated

import typer

from streamkit.cli.common import (
    CoordinatorPortOption,
    RedisClusterOption,
    RedisUrlOption,
    configure_logging,
)

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
    redis_url: RedisUrlOption = None,
    redis_cluster: RedisClusterOption = False,
    console: Annotated[
        bool,
        typer.Option(
            "--console",
            help="Watch in the web console: wait for Enter before starting and before cleaning up.",
        ),
    ] = False,
    port: CoordinatorPortOption = None,
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
    from streamkit.demo.services import LocalServices

    configure_logging("warning")
    options = DemoOptions(
        services=LocalServices(redis_url, redis_cluster, port),
        duration=duration,
        shards=shards,
        scale_to=scale_to,
        rate=rate,
        console=console,
        idempotent=idempotent,
    )
    raise typer.Exit(run_demo(options))
