"""``streamkit run``: bad targets fail fast with one line and exit status 2;
``streamkit dlq``: list and replay dead letters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from streamkit.consumer.failure import dead_letter_fields, dead_letter_key
from streamkit.routing import shard_for_key
from streamkit.testing import RedisTarget, free_port

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
        ("myapp.py", "streamkit run myapp:app"),
        ("pkg/jobs.py:worker", "streamkit run pkg.jobs:worker"),
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
    # `streamkit run myapp` works, so the help must not claim ':attribute' is required.
    text = " ".join(result.stdout.replace("│", " ").split())
    assert "or 'module' for the attribute 'app'" in text, text


@pytest.mark.parametrize("module", ["streamkit", "streamkit_server"])
def test_both_commands_print_their_version(module: str) -> None:
    from streamkit.version import package_version

    result = subprocess.run(
        [sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result
    name = "streamkit" if module == "streamkit" else "streamkit-server"
    assert result.stdout.strip() == f"{name} {package_version()}"


def test_unreachable_redis_fails_fast_naming_the_address() -> None:
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"
    env = {
        "STREAMKIT_REDIS_URL": url,
        "STREAMKIT_COORDINATOR_URL": f"http://127.0.0.1:{free_port()}",
        "SKT_PREFIX": "any",
        "SKT_GROUP": "any",
        "SKT_RECORD": os.devnull,
    }
    result = run("run", "tests.consumer.apps.recording:app", env=env)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach Redis at "), lines
    assert url.replace("secret", "***") in lines[0] and "secret" not in lines[0]
    assert "STREAMKIT_REDIS_URL" in lines[0] and "redis-server running" in lines[0]


def run_until(
    args: list[str], env: Mapping[str, str], needles: list[str], within: float = 20.0
) -> str:
    """Start ``streamkit *args``, wait until its output shows every needle,
    stop it with SIGTERM and return the output."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamkit", *args],
            cwd=REPO,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + within
            text = ""
            while time.monotonic() < deadline:
                out.seek(0)
                text = out.read()
                if all(n in text for n in needles) or proc.poll() is not None:
                    break
                time.sleep(0.1)
        finally:
            proc.terminate()
            proc.wait(30)
        out.seek(0)
        return out.read()


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
def test_unreachable_coordinator_names_url_setting_and_server(
    coordinator: Any, any_redis: RedisTarget
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    env = app_env(
        coordinator, any_redis, base="cli", prefix="p", group="g", record=Path(os.devnull)
    )
    env["STREAMKIT_COORDINATOR_URL"] = down
    text = run_until(["run", "tests.consumer.apps.recording:app"], env, ["heartbeat failed"])
    warning = next(line for line in text.splitlines() if "members keep retrying" in line)
    assert f"the coordinator at {down} is unreachable" in warning, text
    assert "STREAMKIT_COORDINATOR_URL" in warning and "streamkit-server running" in warning
    first_failure = next(line for line in text.splitlines() if "heartbeat failed" in line)
    assert "not joined yet" in first_failure and "lease expired" not in first_failure, text


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_wrong_password_stops_at_start(
    coordinator: Any, any_redis: RedisTarget, admin: Any, names: tuple[str, str]
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    env = app_env(
        coordinator, any_redis, base="cli", prefix=prefix, group=group, record=Path(os.devnull)
    )
    env["STREAMKIT_COORDINATOR_PASSWORD"] = "not-the-password"
    # Every heartbeat would be refused too: one line, before any member joins.
    result = run("run", "tests.consumer.apps.recording:app", env=env)
    assert result.returncode == 2, result
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "401" in line, line
    assert "STREAMKIT_COORDINATOR_USERNAME" in line and "STREAMKIT_COORDINATOR_PASSWORD" in line
    assert "serving" not in result.stdout + result.stderr


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_a_typo_in_the_group_names_the_existing_one(
    coordinator: Any, any_redis: RedisTarget, admin: Any, names: tuple[str, str]
) -> None:
    prefix, _ = names
    await admin.create_group(prefix, "printer", 2)
    env = app_env(
        coordinator, any_redis, base="cli", prefix=prefix, group="printr", record=Path(os.devnull)
    )
    result = run("run", "tests.consumer.apps.recording:app", env=env)
    assert result.returncode == 2, result
    last = result.stderr.strip().splitlines()[-1]
    assert "no consumer group 'printr'" in last and "did you mean 'printer'?" in last, last
    status = run("status", prefix, "printr", env=env)
    assert status.returncode == 2 and "did you mean 'printer'?" in status.stderr, status


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_status_prints_shards_and_members(
    coordinator: Any, any_redis: RedisTarget, admin: Any, names: tuple[str, str], redis: Any
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    await redis.xadd(f"{prefix}:1", {"a": "1"})
    env = app_env(
        coordinator, any_redis, base="cli", prefix=prefix, group=group, record=Path(os.devnull)
    )
    result = run("status", prefix, group, env=env)
    assert result.returncode == 0, result
    lines = result.stdout.splitlines()  # not a terminal: plain lines
    assert lines[0].startswith(f"{prefix}/{group}  state EMPTY  shards 2"), lines
    assert f"shard 1 key={prefix}:1 owner=- length=1 lag=1 pending=0" in lines, lines
    assert "no members" in lines, lines


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
    assert result.returncode == 2, result
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
    # Nothing to replay is said, not silent; an id that is not there fails.
    nothing = await anyio.to_thread.run_sync(lambda: run("dlq", "replay", prefix, group, env=env))
    assert nothing.returncode == 0 and "nothing to replay" in nothing.stderr, nothing
    gone = await anyio.to_thread.run_sync(
        lambda: run("dlq", "replay", prefix, group, "--id", letters[0], env=env)
    )
    assert gone.returncode == 1 and f"{letters[0]}  not replayed: no such" in gone.stderr, gone


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
@pytest.mark.parametrize("freeze", [True, False])
async def test_run_freezes_the_started_heap_unless_told_not_to(
    coordinator: Any, any_redis: RedisTarget, admin: Any, names: tuple[str, str], freeze: bool
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    env = app_env(
        coordinator, any_redis, base="gc", prefix=prefix, group=group, record=Path(os.devnull)
    )
    env["STREAMKIT_GC_FREEZE"] = str(freeze).lower()
    args = ["run", "--log-level", "debug", "tests.consumer.apps.recording:app"]
    # "assigned shards" comes after the freeze (which happens before the members start).
    text = await anyio.to_thread.run_sync(run_until, args, env, ["serving", "assigned shards"])
    assert "assigned shards" in text, text
    froze = [line for line in text.splitlines() if "out of garbage collection" in line]
    if freeze:
        assert len(froze) == 1 and text.index("serving") < text.index(froze[0]), text
        assert int(froze[0].split("froze ")[1].split()[0]) > 10_000, froze  # modules, clients
    else:
        assert not froze, text
