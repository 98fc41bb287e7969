"""``streamkit stream|group create|list|scale|delete`` against a real coordinator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from streamkit.testing import RedisTarget
from streamkit_server.auth.principals import hash_password

from .support import REPO, Admin, app_env

standalone = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)


class Cli:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    async def __call__(self, *args: str, code: int = 0) -> str:
        """Run ``streamkit *args``; assert the exit status; stdout (or the error line)."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
        result = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, "-m", "streamkit", *args],
                env={**clean, **self.env},
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
        assert result.returncode == code, (args, result.stdout, result.stderr)
        if code:
            (line,) = result.stderr.strip().splitlines()
            assert line.startswith("error: "), line
            return line
        return result.stdout


def cli_for(coordinator: Any, target: RedisTarget, **auth: str) -> Cli:
    env = app_env(coordinator, target, base="cli", prefix="-", group="-", record=Path(os.devnull))
    env.update(auth)
    return Cli(env)


@standalone
async def test_create_list_scale_and_delete(
    coordinator: Any, any_redis: RedisTarget, admin: Admin, names: tuple[str, str]
) -> None:
    prefix, group = names
    cli = cli_for(coordinator, any_redis)
    assert await cli("stream", "create", prefix, "--shards", "4") == (
        f"created stream '{prefix}' with 4 shards\n"
    )
    assert await cli("group", "create", prefix, group) == (
        f"created group '{group}' on stream '{prefix}' (4 shards)\n"
    )
    status = await cli("status", prefix, group)
    assert status.startswith(f"{prefix}/{group}  state EMPTY  shards 4"), status
    # Again: refused, naming what exists and how to look.
    line = await cli("stream", "create", prefix, "--shards", "4", code=1)
    assert "409 STREAM_ALREADY_EXISTS" in line and "streamkit stream list" in line, line
    listed = json.loads(await cli("stream", "list", "--json"))
    (mine,) = [s for s in listed["streams"] if s["streamPrefix"] == prefix]
    assert mine == {"streamPrefix": prefix, "shardCount": 4, "groups": [group]}
    assert f"{prefix} {group}  state=EMPTY  shards=4" in await cli("group", "list", prefix)
    # To 0 (a typo away from stopping every publisher) only when confirmed.
    line = await cli("stream", "scale", prefix, "0", code=2)
    assert "to 0 shards drains every shard" in line and "--drain-all" in line, line
    scaled = json.loads(await cli("stream", "scale", prefix, "6", "--json"))
    assert scaled["targetShardCount"] == 6 and scaled["affectedConsumerGroups"] == [group]

    # The scale runs on (its drain proof waits a routing lease); delete another stream.
    other = f"{prefix}-b"
    await cli("group", "create", other, group, "--shards", "2")
    deleted = await cli("stream", "delete", other)
    assert deleted.splitlines()[0] == f"deleted group '{group}' of stream '{other}'", deleted
    assert "stay in Redis" in deleted
    assert (await admin.get(f"/streams/{other}/groups/{group}")).status_code == 404
    line = await cli("group", "delete", prefix, group, code=1)  # mid-migration: refused
    assert "ACTIVE_MIGRATION_EXISTS" in line, line


@standalone
async def test_a_principal_without_write_is_told_which_role(
    any_redis: RedisTarget, coordinator_factory: Any, names: tuple[str, str]
) -> None:
    prefix, _ = names
    reader = {"username": "viewer", "passwordHash": hash_password("pw"), "roles": ["READ"]}
    coordinator = coordinator_factory(
        any_redis, env={"STREAMKIT_SERVER_PRINCIPALS": json.dumps([reader])}
    )
    cli = cli_for(
        coordinator,
        any_redis,
        STREAMKIT_COORDINATOR_USERNAME="viewer",
        STREAMKIT_COORDINATOR_PASSWORD="pw",
    )
    line = await cli("stream", "create", prefix, code=2)
    assert "needs the WRITE role" in line and "principal 'viewer'" in line, line
    await cli("stream", "list")  # listing needs READ only: exit status 0


@standalone
async def test_retention_is_set_shown_and_cleared(
    coordinator: Any, any_redis: RedisTarget, names: tuple[str, str]
) -> None:
    prefix, group = names
    cli = cli_for(coordinator, any_redis)
    await cli("group", "create", prefix, group, "--shards", "1")
    assert await cli("stream", "retention", prefix, "--max-age", "7d", "--max-length", "50") == (
        f"stream '{prefix}': retention max age 7d, max length 50 (its own)\n"
    )
    shown = json.loads(await cli("stream", "retention", prefix, "--json"))
    assert shown["retention"] == {"maxAgeMs": 604_800_000, "maxLength": 50}, shown
    assert shown["source"] == "stream", shown
    cleared = await cli("stream", "retention", prefix, "--none", "--reason", "test")
    assert cleared.startswith(f"stream '{prefix}': retention none"), cleared
