"""The mutation table must stay reproducible: every mutant's pattern applies.

``scripts/mutants.py`` breaks one protocol rule at a time by an exact text
replacement; when the core changes under a pattern, the mutant silently stops
meaning anything.  ``--check`` fails in that case, and CI runs it here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_mutant_pattern_still_applies() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mutants.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr or result.stdout
    assert result.stdout.startswith("all ") and "mutants apply" in result.stdout
