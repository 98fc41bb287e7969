"""The ``streamkit`` command: ``streamkit run module:app`` and its siblings.

One module per command group, each importing what it needs only when its
command runs: ``streamkit --help`` loads typer and nothing else of weight (no
FastAPI, redis-py, dependency-injector or OpenTelemetry), ``--version`` not
even typer, and ``tests/test_cli_startup.py`` keeps it that way.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from streamkit.cli.target import TargetError, load_app

if TYPE_CHECKING:
    from streamkit.cli.main import cli

__all__ = ["TargetError", "cli", "load_app", "main"]


def main() -> None:
    """The ``streamkit`` entry point."""
    if sys.argv[1:] == ["--version"]:
        # The one answer that needs no command line parser at all.
        from streamkit.version import package_version

        print(f"streamkit {package_version()}")
        return
    from streamkit.cli.main import main as run

    run()


def __getattr__(name: str) -> Any:
    if name == "cli":  # the typer app, built on first use
        from streamkit.cli.main import cli

        return cli
    raise AttributeError(f"module 'streamkit.cli' has no attribute {name!r}")
