"""The code stays ruff-clean and the packages mypy --strict clean."""

from __future__ import annotations

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
