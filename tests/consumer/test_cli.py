"""``streamkit run``: bad targets fail fast with one line and exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from streamkit.testing import RedisTarget

from .support import REPO, app_env


def run(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamkit", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
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


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
def test_unknown_group_is_one_clear_line(coordinator: Any, any_redis: RedisTarget) -> None:
    env = app_env(
        coordinator,
        any_redis,
        base="cli",
        prefix="never-created",
        group="nobody",
        record=Path(os.devnull),
    )
    result = run("run", "tests.consumer.apps.recording:app", env=env)
    assert result.returncode == 1, result
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "no consumer group 'nobody'" in last, result.stderr
    assert "Traceback" not in result.stderr
