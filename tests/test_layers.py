"""The server's layers, as docs/architecture.md ("## Server") draws them.

What is enforced (every import counts, also those inside functions and for
type checkers only):

* ``core`` imports nothing of ``streamkit_server`` outside ``core``, and of the
  rest only the standard library, pydantic and ``streamkit.protocol``; it
  imports in a process where FastAPI, Starlette, redis-py and OpenTelemetry
  cannot be imported.
* ``store.keys`` (the key names) imports the standard library only, so the
  client's test launcher can use it without the server.
* ``store`` imports neither ``coordination``, ``api``, ``auth`` nor the
  composition root; ``auth`` and ``observability`` import neither
  ``coordination`` nor ``api``; ``coordination`` does not import ``api``.
* ``api`` never talks to the Redis layout itself: it does not import
  ``store.metadata``, ``store.scripts`` or ``store.batch`` (it names the store's
  types, errors and input validators only).
* No import cycle among the server's modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "streamkit_server"


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every absolute module ``path`` imports (``from m import n``: ``m`` and ``m.n``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            package = _module_name(path, root).split(".")
            if path.name != "__init__.py":
                package = package[:-1]
            base = ".".join(package[: len(package) - node.level + 1])
            found.add(f"{base}.{node.module}" if node.module else base)
    return found


def _modules(package: str) -> dict[str, Path]:
    folder = ROOT / package.replace(".", "/")
    return {_module_name(p): p for p in folder.rglob("*.py")}


SERVER_MODULES = _modules("streamkit_server")


def _server_imports(name: str) -> set[str]:
    """The server modules (and packages) module ``name`` imports."""
    found = _imports(SERVER_MODULES[name])
    return {m for m in found if m.split(".")[0] == "streamkit_server"} - {name}


def _in(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _violations(layer: str, forbidden: tuple[str, ...]) -> dict[str, set[str]]:
    out = {}
    for name in SERVER_MODULES:
        if _in(name, layer):
            bad = {m for m in _server_imports(name) if _in(m, *forbidden)}
            if bad:
                out[name] = bad
    return out


def test_the_scanner_sees_relative_and_nested_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    sample = pkg / "mod.py"
    sample.write_text("from .sibling import x\ndef f():\n    import fastapi\n")
    assert _imports(sample, tmp_path) == {"pkg.sibling", "fastapi"}


def test_core_imports_only_the_stdlib_pydantic_and_the_protocol() -> None:
    stdlib = set(sys.stdlib_module_names)
    allowed_roots = stdlib | {"pydantic", "pydantic_core", "typing_extensions"}
    for name, path in SERVER_MODULES.items():
        if not _in(name, "streamkit_server.core"):
            continue
        for imported in _imports(path):
            root = imported.split(".")[0]
            if root == "streamkit_server":
                assert _in(imported, "streamkit_server.core"), (name, imported)
            elif root == "streamkit":
                assert _in(imported, "streamkit.protocol"), (name, imported)
            else:
                assert root in allowed_roots, (name, imported)


def test_key_names_are_a_stdlib_leaf() -> None:
    path = SERVER_MODULES["streamkit_server.store.keys"]
    roots = {m.split(".")[0] for m in _imports(path)}
    assert roots <= set(sys.stdlib_module_names), roots


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        (
            "streamkit_server.store",
            (
                "streamkit_server.coordination",
                "streamkit_server.api",
                "streamkit_server.auth",
                "streamkit_server.runtime",
            ),
        ),
        ("streamkit_server.auth", ("streamkit_server.coordination", "streamkit_server.api")),
        (
            "streamkit_server.observability",
            ("streamkit_server.coordination", "streamkit_server.api", "streamkit_server.runtime"),
        ),
        ("streamkit_server.coordination", ("streamkit_server.api", "streamkit_server.runtime")),
        (
            "streamkit_server.api",
            (
                "streamkit_server.store.metadata",
                "streamkit_server.store.scripts",
                "streamkit_server.store.batch",
            ),
        ),
    ],
)
def test_layer_does_not_import(layer: str, forbidden: tuple[str, ...]) -> None:
    assert _violations(layer, forbidden) == {}


def test_a_forbidden_import_is_reported() -> None:
    # The check can fail: the composition root imports the store's metadata.
    assert _violations("streamkit_server.runtime", ("streamkit_server.store.metadata",))


def test_no_import_cycle_among_server_modules() -> None:
    from test_quality import _cycles

    names = set(SERVER_MODULES)
    graph = {}
    for name in names:
        # A package's own __init__ runs before any of its submodules anyway,
        # so an import of the package is not an edge to every submodule.
        graph[name] = {m for m in _server_imports(name) if m in names and m != name}
        graph[name] -= {p for p in graph[name] if name.startswith(p + ".")}
    assert _cycles(graph) == []


_BLOCKER = """
import sys
BLOCKED = ("fastapi", "starlette", "redis", "opentelemetry", "uvicorn", "hiredis",
           "prometheus_client")

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Blocker())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKER + code], cwd=ROOT, capture_output=True, text=True
    )


def test_the_blocker_blocks() -> None:
    result = _run("import fastapi")
    assert result.returncode != 0 and "blocked in this test" in result.stderr


def test_core_and_key_names_import_without_web_stack_redis_or_tracing() -> None:
    result = _run(
        "import streamkit_server.core, streamkit_server.store.keys\n"
        "from streamkit_server.core import handle_heartbeat, new_group\n"
        "print('ok')"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_import_streamkit_does_not_import_fastapi() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import sys, streamkit; print('fastapi' in sys.modules)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
