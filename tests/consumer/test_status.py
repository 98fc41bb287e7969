"""``streamkit status``: departed members until the coordinator forgets them; ``--watch``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from streamkit import Message
from streamkit.status import DEPARTED_RETENTION_S
from streamkit.testing import RedisTarget
from streamkit_server.core import CoordinatorConfig

from .support import REPO, Admin, InProcessApp, app_env, eventually, serving

standalone = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)


def test_the_retention_shown_is_the_coordinators() -> None:
    assert DEPARTED_RETENTION_S * 1000 == CoordinatorConfig().dead_member_retention_ms


def _env(coordinator: Any, target: RedisTarget, prefix: str, group: str) -> dict[str, str]:
    env = app_env(
        coordinator, target, base="st", prefix=prefix, group=group, record=Path(os.devnull)
    )
    return {**{k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}, **env}


@standalone
async def test_members_that_left_show_until_forgotten(
    coordinator: Any,
    any_redis: RedisTarget,
    admin: Admin,
    names: tuple[str, str],
    make_app: InProcessApp,
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    app = make_app("st")

    @app.stream_listener(stream_prefix=prefix, group=group, concurrency=2)
    async def handle(msg: Message) -> None:
        await msg.ack()

    async def both_own_shards() -> bool:
        return len(await admin.owners(prefix, group)) == 2

    async with serving(app):  # at the end both members drain and leave
        await eventually(both_own_shards, within=30, what="two members owning shards")
    env = _env(coordinator, any_redis, prefix, group)
    result = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-m", "streamkit", "status", prefix, group],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "members 0 (+2 departed)" in lines[0], lines
    departed = [line for line in lines if line.startswith("member ")]
    assert len(departed) == 2, lines
    for line in departed:
        assert "state=LEAVING" in line and "shards=-" in line, line
        when = re.search(r"\(left (\d+)s ago; forgotten in (\d+)s\)$", line)
        assert when is not None and int(when[1]) + int(when[2]) == DEPARTED_RETENTION_S, line


@standalone
async def test_watch_prints_stamped_blocks_without_a_terminal(
    coordinator: Any, any_redis: RedisTarget, admin: Admin, names: tuple[str, str]
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    env = _env(coordinator, any_redis, prefix, group)
    seen, err, code = await anyio.to_thread.run_sync(_watch_three_refreshes, env, prefix, group)
    assert code == 0, err
    headlines = [line for line in seen if f"{prefix}/{group}" in line]
    assert len(headlines) >= 3, seen
    assert all(line[2] == ":" and line[5] == ":" for line in headlines), headlines  # HH:MM:SS
    assert "Traceback" not in err and "Aborted" not in err, err


def _watch_three_refreshes(
    env: dict[str, str], prefix: str, group: str
) -> tuple[list[str], str, int]:
    """``status --watch`` piped: its lines until three refreshes, then Ctrl-C."""
    command = ["status", prefix, group, "--watch", "--interval", "0.2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamkit", *command],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    seen: list[str] = []
    while sum(f"{prefix}/{group}" in line for line in seen) < 3 and time.monotonic() < deadline:
        seen.append(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)  # Ctrl-C ends the watch, without an error
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        err += "\n(the Ctrl-C was ignored: killed after 30 s)"
    return seen, err, proc.returncode
