"""The code stays ruff-clean and the packages mypy --strict clean."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean() -> None:
    result = _run(sys.executable, "-m", "ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_packages_are_mypy_strict_clean() -> None:
    result = _run(sys.executable, "-m", "mypy", "--strict", "streamkit", "streamkit_server")
    assert result.returncode == 0, result.stdout + result.stderr


# -- the client's imports --------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str], *, runtime_only: bool = False) -> set[str]:
    """The ``known`` modules ``path`` imports: anywhere in it (functions and
    ``TYPE_CHECKING`` blocks too, unless ``runtime_only``), absolute imports only."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    skipped: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped |= {id(child) for child in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
            # ``from pkg import sub`` depends on the submodule; the package's
            # own ``__init__`` runs first anyway, as every ancestor's does, so
            # counting it would make a cycle of every package that names its
            # submodules (a lazy entry point, for one).
            found |= submodules
            if len(submodules) < len(node.names):  # a name from the package itself
                found.add(node.module)
    return found & known


def _client_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in (ROOT / "streamkit").rglob("*.py")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_streamkit_modules() -> None:
    # Every import counts, also those for type checkers only and those inside
    # functions: a cycle there is a layering mistake even when it runs.
    modules = _client_modules()
    graph = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}
    assert _cycles(graph) == []


def test_results_is_a_leaf() -> None:
    # PublishResult, ConsumeResult and the outcomes are named by the publisher,
    # the poller and the middlewares alike, so at run time they import nothing
    # of streamkit (the protocol's wire models aside).
    modules = _client_modules()
    imported = _imports(modules["streamkit.results"], set(modules), runtime_only=True)
    assert imported <= {"streamkit.protocol"}


def test_import_streamkit_loads_no_web_framework() -> None:
    # The coordinator's web stack (FastAPI, Starlette) and the server package
    # are not the client's: importing the client, or its publisher, poller,
    # member runtime and test launchers, loads none of them.
    code = (
        "import sys, streamkit, streamkit.publisher.publisher, streamkit.consumer.poller, "
        "streamkit.consumer.runtime, streamkit.middleware, streamkit.testing.coordinator\n"
        "heavy = ('fastapi', 'starlette', 'streamkit_server')\n"
        "print(','.join(sorted(m for m in heavy if m in sys.modules)))"
    )
    result = _run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
