"""The reference contract, ``coordinator.v1.yaml``, that the contract tests compare with.

It lives beside the repository (``../shared/reference/``, where CI lays it
out; ``STREAMKIT_REFERENCE_SPEC`` names another path), not in it.  A clone
with nothing beside it skips the comparisons with a visible reason (a line at
the end of the run says how many); a ``../shared`` without the contract is a
broken layout and fails.  The project's own OpenAPI document is kept in the
repository as ``docs/api.md``, generated from the served schema and checked
by ``tests/test_docs.py`` on every run.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

__all__ = ["MISSING_REASON", "needs_reference", "reference_contract", "reference_path"]

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MISSING_REASON = (
    "the reference contract coordinator.v1.yaml is not beside this checkout "
    "(../shared/reference/; STREAMKIT_REFERENCE_SPEC names another path)"
)

# ``summary: Compatibility: create ...`` in the reference is not valid YAML (a
# plain scalar may not contain ": "); the JVM tooling tolerates it, PyYAML does
# not.  Such values are quoted before a second parse attempt.
_PLAIN_VALUE_WITH_COLON = re.compile(r"^(\s*[\w$-]+: )([^\"'|>{\[&*!#].*: .*)$")


def _candidates() -> list[Path]:
    named = os.environ.get("STREAMKIT_REFERENCE_SPEC")
    return [
        *([Path(named)] if named else []),
        SHARED / "reference" / "coordinator.v1.yaml",
        ROOT / "reference" / "coordinator.v1.yaml",
    ]


def reference_path() -> Path | None:
    return next((p for p in _candidates() if p.is_file()), None)


#: For tests that need the contract before they start (a coordinator fixture).
needs_reference = pytest.mark.skipif(
    reference_path() is None and not SHARED.is_dir(), reason=MISSING_REASON
)


def load_contract(text: str) -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = yaml.safe_load(text)
    except yaml.YAMLError:
        repaired = "\n".join(
            f"{m[1]}{json.dumps(m[2])}" if (m := _PLAIN_VALUE_WITH_COLON.match(line)) else line
            for line in text.splitlines()
        )
        loaded = yaml.safe_load(repaired)
    return loaded


@cache
def reference_contract() -> dict[str, Any]:
    """The parsed contract; skips the calling test on a clone without it."""
    path = reference_path()
    if path is None:
        if SHARED.is_dir():
            pytest.fail(f"{SHARED} exists but holds no reference/coordinator.v1.yaml")
        pytest.skip(MISSING_REASON)
    return load_contract(path.read_text(encoding="utf-8"))
