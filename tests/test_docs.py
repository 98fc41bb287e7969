"""The documentation cannot drift from the code.

* every ``STREAMKIT_SERVER_*`` setting is in the configuration table of
  ``docs/operations.md`` with its real flag and default, and nothing else is;
* every ``redis_stream_coord_*`` metric and every server errorCode is documented;
* ``docs/api.md`` is exactly what ``scripts/gen_api_docs.py`` generates from
  the server's OpenAPI document;
* every ``python`` code block in ``docs/*.md`` and ``README.md`` compiles, and
  its ``streamkit``/``streamkit_server`` imports resolve (a block preceded by a
  ``<!-- no-test -->`` line is skipped); a block that starts with an import is
  a complete program and uses no name it does not define or import;
* ``mkdocs build --strict`` succeeds (broken links and anchors included).

None of these tests needs Redis.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers import assert_same_settings, setting_row, table_cells, table_rows
from pydantic_core import PydanticUndefined

from streamkit.protocol import HeartbeatStatus
from streamkit_server.observability.metrics import Metrics
from streamkit_server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
OPERATIONS = DOCS / "operations.md"
RESHARDING = DOCS / "resharding.md"
SERVER = ROOT / "streamkit_server"


# -- (a) the configuration table ---------------------------------------------------------


def _settings_table() -> dict[str, list[str]]:
    return table_rows(OPERATIONS, re.compile(r"STREAMKIT_SERVER_[A-Z0-9_]+"))


def _env(name: str) -> str:
    return f"STREAMKIT_SERVER_{name.upper()}"


def _expected_default(name: str) -> str:
    field = ServerSettings.model_fields[name]
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    else:
        value = field.default
    assert value is not PydanticUndefined, f"{name} has no default; document it by hand"
    if value is None:
        # The two secrets without a value are generated at start-up; other
        # optional settings are simply absent.
        return "generated" if name in {"admin_password", "token_secret"} else "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def test_every_setting_is_in_the_configuration_table() -> None:
    expected = [_env(name) for name in ServerSettings.model_fields]
    assert_same_settings(_settings_table(), expected, "docs/operations.md")


@pytest.mark.parametrize("name", sorted(ServerSettings.model_fields))
def test_setting_row_matches_the_code(name: str) -> None:
    _, flag, default, meaning = setting_row(_settings_table(), _env(name), "docs/operations.md", 4)
    assert flag == "--" + name.replace("_", "-")
    assert default == _expected_default(name), (
        f"{_env(name)}: docs say default {default!r}, settings.py has {_expected_default(name)!r}"
    )
    # One text: the Field's description is both this cell and the --help line.
    described = ServerSettings.model_fields[name].description
    assert described, f"{name} has no description in streamkit_server/settings.py"
    assert _raw_meaning(_env(name)) == described, (
        f"{_env(name)}: the Meaning cell of docs/operations.md differs from the description "
        "in streamkit_server/settings.py (which streamkit-server --help prints); make them equal"
    )
    assert meaning


def _raw_meaning(env: str) -> str:
    """The last cell of the setting's row, with its markdown (backticks) intact."""
    for line in OPERATIONS.read_text(encoding="utf-8").splitlines():
        if line.startswith(f"| `{env}` |"):
            return re.split(r"(?<!\\)\|", line.strip().strip("|"))[-1].strip()
    raise AssertionError(f"no row for {env}")


def test_server_help_describes_every_option() -> None:
    from streamkit_server.cli import option_help

    result = subprocess.run(
        [sys.executable, "-m", "streamkit_server", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "4000"},  # one line per option, as wide as it takes
    )
    assert result.returncode == 0, result.stderr
    for name in ServerSettings.model_fields:
        assert option_help(name) in result.stdout, f"--help lacks the text of {name}"
        assert "env STREAMKIT_SERVER_" in option_help(name)


# -- metrics and error codes -------------------------------------------------------------


def _metric_names() -> set[str]:
    names = set()
    for family in Metrics().registry.collect():
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    return names


def test_every_metric_is_documented() -> None:
    documented = set(table_rows(OPERATIONS, re.compile(r"redis_stream_coord_\w+")))
    actual = _metric_names()
    assert not sorted(actual - documented), (
        f"metrics missing from docs/operations.md: {sorted(actual - documented)}"
    )
    assert not sorted(documented - actual), (
        f"docs/operations.md documents metrics that do not exist: {sorted(documented - actual)}"
    )


def test_every_metric_to_alert_on_has_a_runbook_section() -> None:
    """Seed 001/000: a runbook per alert.  Every metric whose "alert on" cell is
    more than informational is named in an ``### Alert: ...`` section."""
    text = OPERATIONS.read_text(encoding="utf-8")
    runbook = text[text.index("## Runbook") :]
    sections = re.split(r"^### ", runbook, flags=re.M)
    alert_text = "\n".join(sec for sec in sections if sec.startswith("Alert: "))
    rows = re.findall(r"^\| `(redis_stream_coord_\w+)` \|.*\| ([^|]*) \|$", text, re.M)
    assert len(rows) >= 20, rows
    missing = [name for name, alert in rows
               if not alert.startswith("Informational") and name not in alert_text]  # fmt: skip
    assert not missing, f"metrics to alert on without an 'Alert:' runbook section: {missing}"


_CODE_PATTERNS = (
    re.compile(r"ApiError\(\s*\d{3},\s*\"([A-Z][A-Z0-9_]+)\""),
    re.compile(r"CoordinatorError\(\s*\"([A-Z][A-Z0-9_]+)\""),
    re.compile(r"\bRejected\(\s*\"([A-Z][A-Z0-9_]+)\""),
    re.compile(r"error_response\(\s*\d{3},\s*\"([A-Z][A-Z0-9_]+)\""),
    re.compile(r"^\s*error_code = \"([A-Z][A-Z0-9_]+)\"", re.MULTILINE),
)
_RESHARDING_CODE = re.compile(r"ReshardingRejected\(\s*\"([A-Z][A-Z0-9_]+)\"")


def _server_sources() -> list[str]:
    return [p.read_text(encoding="utf-8") for p in sorted(SERVER.rglob("*.py"))]


def _documented_codes(path: Path) -> set[str]:
    """Second cells of the table rows whose first cell is an HTTP status."""
    codes = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("|"):
            cells = table_cells(line)
            if len(cells) > 1 and re.fullmatch(r"\d{3}", cells[0]):
                codes.add(cells[1])
    return codes


def test_every_error_code_is_documented() -> None:
    from streamkit_server.api.errors import _HTTP_CODES

    codes: set[str] = set(_HTTP_CODES.values())
    for source in _server_sources():
        for pattern in _CODE_PATTERNS:
            codes.update(pattern.findall(source))
    assert "GROUP_NOT_FOUND" in codes  # the patterns still find what they should
    # Codes the framework may produce for any status are named in the prose.
    text = OPERATIONS.read_text(encoding="utf-8")
    documented = _documented_codes(OPERATIONS) | {
        c for c in _HTTP_CODES.values() if f"`{c}`" in text
    }
    missing = sorted(codes - documented)
    assert not missing, f"errorCodes missing from docs/operations.md: {missing}"


def test_every_resharding_error_code_is_documented() -> None:
    codes = {c for source in _server_sources() for c in _RESHARDING_CODE.findall(source)}
    assert codes, "no ReshardingRejected codes found; update the pattern"
    missing = sorted(codes - _documented_codes(RESHARDING))
    assert not missing, f"errorCodes missing from docs/resharding.md: {missing}"


def test_every_heartbeat_status_is_documented() -> None:
    text = OPERATIONS.read_text(encoding="utf-8")
    missing = [s.value for s in HeartbeatStatus if f"`{s.value}`" not in text]
    assert not missing, f"heartbeat statuses missing from docs/operations.md: {missing}"


# -- (b) the generated API reference -------------------------------------------------------


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_api_docs", ROOT / "scripts/gen_api_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_matches_the_openapi_document() -> None:
    generator = _generator()
    expected = generator.render(generator.build_app())
    committed = (DOCS / "api.md").read_text(encoding="utf-8")
    assert committed == expected, (
        "docs/api.md is out of date with the server's OpenAPI document; "
        "run `.venv/bin/python scripts/gen_api_docs.py` and commit the result"
    )


def test_api_reference_lists_every_operation() -> None:
    generator = _generator()
    schema = generator.build_app().openapi()
    committed = (DOCS / "api.md").read_text(encoding="utf-8")
    for item in schema["paths"].values():
        for operation in item.values():
            assert f"### `{operation['operationId']}`" in committed


# -- (c) code blocks ---------------------------------------------------------------------------

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_NO_TEST = "<!-- no-test -->"
_PYTHON = {"python", "py", "python3"}


@dataclass(frozen=True)
class CodeBlock:
    path: Path
    line: int
    source: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _python_blocks(path: Path) -> list[CodeBlock]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[CodeBlock] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent, fence, lang = match["indent"], match["fence"], match["lang"].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1  # the closing fence
        previous = start - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        opted_out = previous >= 0 and lines[previous].strip() == _NO_TEST
        if lang in _PYTHON and not opted_out:
            blocks.append(CodeBlock(path, start + 1, "\n".join(body) + "\n"))
    return blocks


def _all_blocks() -> list[CodeBlock]:
    files = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]
    return [block for path in files if path.exists() for block in _python_blocks(path)]


_BLOCKS = _all_blocks()


def test_code_block_scanner_sees_the_known_blocks() -> None:
    # Guards the scanner itself: index.md shows a listener on purpose.
    assert any(b.path.name == "index.md" for b in _BLOCKS)


def _is_ours(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in {"streamkit", "streamkit_server"}


@pytest.mark.parametrize("block", _BLOCKS, ids=[b.where for b in _BLOCKS])
def test_python_code_block(block: CodeBlock) -> None:
    try:
        compile(block.source, block.where, "exec")
        tree = ast.parse(block.source, block.where)
    except SyntaxError as exc:
        pytest.fail(f"{block.where}: does not compile ({exc}); fix it or mark it {_NO_TEST}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_ours(node.module):
            assert node.module is not None
            module = importlib.import_module(node.module)
            for alias in node.names:
                if alias.name == "*" or hasattr(module, alias.name):
                    continue
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    pytest.fail(f"{block.where}: `{node.module}` has no `{alias.name}`")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_ours(alias.name):
                    importlib.import_module(alias.name)


def _complete_program(block: CodeBlock) -> bool:
    """A block that starts with an import is a program, not a fragment."""
    try:
        body = ast.parse(block.source).body
    except SyntaxError:
        return False
    return bool(body) and isinstance(body[0], ast.Import | ast.ImportFrom)


def test_complete_programs_define_every_name(tmp_path: Path) -> None:
    """What a reader copies into a file runs as is: no name used but never defined."""
    programs = {tmp_path / f"block{i}.py": b for i, b in enumerate(_BLOCKS) if _complete_program(b)}
    assert len(programs) >= 10, "the scanner found too few complete programs"
    for path, block in programs.items():
        path.write_text(block.source, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache",
         "--select", "F821,F822,F823", "--output-format", "json", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    problems = [
        f"{programs[Path(e['filename'])].where} (line {e['location']['row']} of the block): "
        f"{e['message']}"
        for e in json.loads(result.stdout or "[]")
    ]
    assert not problems, "doc programs that do not run as written:\n" + "\n".join(problems)


# -- (d) the site builds ---------------------------------------------------------------------


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs-material is not installed (pip install -e '.[docs]')",
)
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}{result.stderr}"
