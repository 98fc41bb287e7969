"""The root of the ``streamkit`` command: its commands, ``--version``, ``-v`` and
the one place where an error becomes one ``error:`` line."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from streamkit.cli import admin, dev, dlq, publish, status
from streamkit.cli import demo as demo_command
from streamkit.cli import docs as docs_command
from streamkit.cli import run as run_command
from streamkit.cli.common import debug_enabled

__all__ = ["cli", "main"]

cli = typer.Typer(
    name="streamkit",
    help="Run streamkit applications.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain help: rich-formatted help would import rich and markdown-it on
    # every --help, a third of the command's start-up.
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from streamkit.version import package_version

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
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Show the traceback of an error (as STREAMKIT_DEBUG=1 does)."
        ),
    ] = False,
) -> None:
    """streamkit: sharded Redis Streams with a coordinator."""
    if verbose:
        # Through the environment, so `run --workers` children inherit it.
        os.environ["STREAMKIT_DEBUG"] = "1"


cli.command()(run_command.run)
cli.command()(dev.dev)
cli.command()(status.status)
cli.command()(publish.publish)
cli.command()(demo_command.demo)
cli.command()(docs_command.docs)
cli.add_typer(admin.stream)
cli.add_typer(admin.group)
cli.add_typer(dlq.dlq)


def main() -> None:
    """The ``streamkit`` entry point."""
    try:
        code = cli(standalone_mode=False)
    except SystemExit:
        raise
    except BaseException as exc:
        if debug_enabled():
            raise
        code = _usage_error(exc)
        if code is None:
            from streamkit.cli.errors import describe

            message, code = describe(exc)
            from streamkit.cli.output import printable

            print(f"error: {printable(message)}", file=sys.stderr, flush=True)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_error(exc: BaseException) -> int | None:
    """A command line the parser refused (a misspelt option, a missing
    argument): one line and its usage hint instead of click's block.  None
    for anything else.  (typer's click is private: known by its shape.)"""
    show, message = getattr(exc, "show", None), getattr(exc, "format_message", None)
    if not callable(show) or not callable(message):
        return None
    code = int(getattr(exc, "exit_code", 2))
    if type(exc).__name__ == "NoArgsIsHelpError":  # `streamkit stream`: the help is the answer
        show()
        return code
    ctx = getattr(exc, "ctx", None)
    hint = f" ({ctx.command_path} --help shows the usage)" if ctx is not None else ""
    print(f"error: {message()}{hint}", file=sys.stderr, flush=True)
    return code
