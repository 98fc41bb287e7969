"""``streamkit run``: bad targets fail fast with one line and exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .support import REPO


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamkit", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("no_such_module_xyz:app", "cannot import module 'no_such_module_xyz'"),
        ("tests.consumer.apps.nothing_here:app", "cannot import module"),
        ("streamkit.settings:no_app", "has no attribute 'no_app'"),
        ("streamkit.settings:StreamKitSettings", "not a streamkit.StreamKit application"),
        ("not a path", "is not an import path"),
    ],
)
def test_bad_import_path(target: str, fragment: str) -> None:
    result = run("run", target)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0], lines
    assert "Traceback" not in result.stderr


def test_help_lists_the_options() -> None:
    result = run("run", "--help")
    assert result.returncode == 0
    for option in ("--workers", "--log-level"):
        assert option in result.stdout
