"""``streamkit dev app:app``: Redis, a coordinator and the app, in one command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from streamkit.cli.common import (
    CoordinatorPortOption,
    RedisClusterOption,
    RedisUrlOption,
    configure_logging,
)

__all__ = ["dev"]


def dev(
    target: Annotated[
        str, typer.Argument(help="The app: 'module:attribute' (as for streamkit run).")
    ],
    redis_url: RedisUrlOption = None,
    redis_cluster: RedisClusterOption = False,
    port: CoordinatorPortOption = None,
    env_file: Annotated[
        Path | None,
        typer.Option(
            help="Also write the settings to this file (e.g. .env, which streamkit commands "
            "started in its directory read); removed at exit."
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="critical, error, warning, info or debug.")
    ] = "info",
    http: Annotated[
        str | None, typer.Option(help="HOST:PORT for /healthz, /readyz and /metrics.")
    ] = None,
) -> None:
    """Run the app against a private Redis and coordinator, creating its streams.

    Prints the coordinator's console link, its generated admin password and an
    `export` line for a second terminal.  Ctrl-C drains the app, then stops the
    coordinator and Redis.
    """
    configure_logging(log_level)
    from streamkit.demo.dev import DevOptions, run_dev
    from streamkit.demo.services import LocalServices

    services = LocalServices(redis_url, redis_cluster, port)
    options = DevOptions(target, services, env_file=env_file, http=http)
    raise typer.Exit(run_dev(options))
