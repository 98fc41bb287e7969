"""Every error code raised below ``api/`` has exactly one HTTP status, in ``api/errors.py``."""

from __future__ import annotations

import ast
from pathlib import Path

from streamkit_server.api.errors import STATUS_BY_CODE

ROOT = Path(__file__).resolve().parents[3] / "streamkit_server"
RAISERS = {"CoordinatorError", "ReshardingRejected", "Rejected"}


def _raised_codes() -> dict[str, str]:
    """error code -> where it is raised, for every literal code below api/."""
    found: dict[str, str] = {}
    for path in ROOT.rglob("*.py"):
        if "api" in path.relative_to(ROOT).parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            first = node.args[0]
            if name in RAISERS and isinstance(first, ast.Constant):
                found[str(first.value)] = f"{path.name}:{node.lineno}"
            if name == "_validate_name" and len(node.args) >= 3:
                code = node.args[2]
                if isinstance(code, ast.Constant):
                    found[str(code.value)] = f"{path.name}:{node.lineno}"
    return found


def test_every_code_raised_below_the_api_has_a_status() -> None:
    raised = _raised_codes()
    assert len(raised) > 15  # the scan found the raisers at all
    missing = {code: where for code, where in raised.items() if code not in STATUS_BY_CODE}
    assert not missing, f"add these codes to STATUS_BY_CODE: {missing}"


def test_no_http_status_below_the_api() -> None:
    offenders = []
    for path in ROOT.rglob("*.py"):
        if "api" in path.relative_to(ROOT).parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "ApiError":
                offenders.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr == "status_code":
                offenders.append(f"{path.name}:{node.lineno}")
    allowed = {"errors.py"}  # where ApiError itself is defined
    assert [o for o in offenders if o.split(":")[0] not in allowed] == []
