"""A command a person types answers at once: what ``streamkit`` imports per command.

Timings belong to ``bench/cli.py``; this checks the cause instead: which
modules a command loads.  ``--version`` and ``--help`` (of the root and of
every command) load no web framework, no Redis client, no dependency
injection, no tracing, not the app and not the wire models; ``status`` and
the admin commands load the HTTP client but no Redis client or app.
(pydantic is allowed in a command's own ``--help``: typer 0.29 converts the
parameters of a command with it.)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Top-level packages (or streamkit modules) no help or version may import.
HEAVY = (
    "fastapi",
    "starlette",
    "uvicorn",
    "dependency_injector",
    "redis",
    "opentelemetry",
    "httpx",
    "pydantic_settings",
    "rich",
    "anyio",
    "streamkit.app",
    "streamkit.protocol",
    "streamkit.settings",
    "streamkit_server",
)

_PROBE = """
import json, sys
sys.argv = ["streamkit", *json.loads(sys.argv[1])]
from streamkit.cli import main
try:
    main()
except SystemExit:
    pass
sys.stdout.flush()
print("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""


def loaded_by(*args: str) -> tuple[set[str], str]:
    """The modules ``streamkit *args`` loaded in a fresh interpreter, and its output."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(list(args))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output, _, modules = result.stdout.rpartition("\nMODULES ")
    assert modules, result.stderr
    return set(json.loads(modules)), output


def heavy(modules: set[str]) -> list[str]:
    return sorted(
        name for name in modules if any(name == h or name.startswith(h + ".") for h in HEAVY)
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["run", "--help"],
        ["dev", "--help"],
        ["status", "--help"],
        ["publish", "--help"],
        ["demo", "--help"],
        ["docs", "--help"],
        ["stream", "--help"],
        ["stream", "create", "--help"],
        ["group", "list", "--help"],
        ["dlq", "replay", "--help"],
    ],
    ids=" ".join,
)
def test_help_and_version_import_nothing_heavy(args: list[str]) -> None:
    modules, output = loaded_by(*args)
    assert output.strip(), "printed nothing"
    assert heavy(modules) == [], f"streamkit {' '.join(args)} imported {heavy(modules)}"


def test_root_help_loads_no_pydantic() -> None:
    # A command's own --help does: typer converts its parameters with pydantic.
    modules, _ = loaded_by("--help")
    assert "pydantic" not in modules


def test_version_does_not_even_build_the_command_line() -> None:
    modules, output = loaded_by("--version")
    assert output.startswith("streamkit ")
    assert not any(m == "typer" or m.startswith(("typer.", "click")) for m in modules)


def test_status_loads_the_http_client_but_no_redis_or_app() -> None:
    # The coordinator is not running: the command fails, but only after
    # importing what it needs.
    modules, _ = loaded_by("status", "orders", "billing")
    assert "httpx" in modules and "streamkit.coordinator_client" in modules
    for name in ("redis", "dependency_injector", "fastapi", "streamkit.app", "opentelemetry"):
        assert name not in modules, f"streamkit status imported {name}"


_SERVER_PROBE = """
import json, sys
from streamkit_server.cli import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit:
    pass
sys.stdout.flush()
print("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""


#: What only serving needs: ``--version`` and ``--help`` must not wait for it.
_SERVING = (
    "fastapi", "starlette", "uvicorn", "redis", "httpx", "opentelemetry",
    "streamkit_server.api", "streamkit_server.runtime", "streamkit_server.serve",
)  # fmt: skip


@pytest.mark.parametrize("args", [["--version"], ["--help"]], ids=" ".join)
def test_server_help_and_version_load_no_web_framework_or_redis(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SERVER_PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output, _, modules_json = result.stdout.rpartition("\nMODULES ")
    modules = set(json.loads(modules_json))
    assert output.startswith("streamkit-server ") or "usage: streamkit-server" in output
    loaded = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in _SERVING))
    assert loaded == [], f"streamkit-server {' '.join(args)} imported {loaded}"
    if args == ["--version"]:
        assert "pydantic" not in modules, "--version needs no settings model"
