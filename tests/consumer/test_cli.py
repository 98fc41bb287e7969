"""``streamkit run``: bad targets fail fast with one line and exit status 2;
``streamkit dlq``: list and replay dead letters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from streamkit.failure import dead_letter_fields, dead_letter_key
from streamkit.routing import shard_for_key
from streamkit.testing import RedisTarget

from .support import REPO, Admin, app_env


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


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_dlq_list_and_replay(
    coordinator: Any, any_redis: RedisTarget, admin: Admin, redis: Any, names: tuple[str, str]
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 4)
    dlq = dead_letter_key(prefix, group)
    letters = []
    for n, key in enumerate(["alpha", "beta", "gamma"]):
        shard = shard_for_key(key, 4)
        fields = dead_letter_fields(
            {b"payload": json.dumps({"id": key, "n": n}).encode(), b"kind": b"order"},
            stream_key=f"{prefix}:{shard}",
            entry_id=f"{n + 1}-0",
            consumer_group=group,
            attempts=5,
            error="RuntimeError: boom",
        )
        letters.append((await redis.xadd(dlq, fields)).decode())
    env = app_env(coordinator, any_redis, base="dlq", prefix=prefix, group=group,
                  record=Path(os.devnull))  # fmt: skip

    listed = await anyio.to_thread.run_sync(lambda: run("dlq", "list", prefix, group, "--json",
                                                        env=env))  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["id"] for r in rows] == letters
    assert rows[0]["originalId"] == "1-0" and rows[0]["attempts"] == 5
    assert rows[0]["fields"] == {"payload": '{"id": "alpha", "n": 0}', "kind": "order"}

    # One back to its original shard stream, the others routed by their key.
    first = await anyio.to_thread.run_sync(
        lambda: run("dlq", "replay", prefix, group, "--id", letters[0], env=env)
    )
    assert first.returncode == 0, first.stderr
    rest = await anyio.to_thread.run_sync(
        lambda: run("dlq", "replay", prefix, group, "--payload-key", "id", env=env)
    )
    assert rest.returncode == 0, rest.stderr
    assert await redis.xlen(dlq) == 0
    for key in ("alpha", "beta", "gamma"):
        entries = await redis.xrange(f"{prefix}:{shard_for_key(key, 4)}")
        payloads = [json.loads(f[b"payload"])["id"] for _, f in entries]
        assert payloads.count(key) == 1, (key, payloads)
        (fields,) = [f for _, f in entries if json.loads(f[b"payload"])["id"] == key]
        assert not any(name.startswith(b"x-") for name in fields)  # metadata dropped
    empty = await anyio.to_thread.run_sync(lambda: run("dlq", "list", prefix, group, env=env))
    assert empty.returncode == 0 and "no dead letters" in empty.stderr
