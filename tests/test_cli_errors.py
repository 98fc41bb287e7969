"""Every start-up failure of a ``streamkit`` command is one ``error:`` line, exit 2.

A table of the mistakes a user makes (a handler the listener cannot call, a
Redis URL without its scheme, a user name without a password, a target that
does not import, an unreachable Redis, missing credentials, ...) goes through
the real command in a subprocess: each prints exactly one line that names
what is wrong and the setting or flag that fixes it, and no traceback unless
``STREAMKIT_DEBUG=1`` (or ``-v``) asks for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from consumer.support import app_env
from helpers import create_group

from streamkit.testing import RedisTarget, free_port

APPS = {
    "good.py": """
from streamkit import Message, StreamKit

app = StreamKit()


@app.stream_listener(stream_prefix="orders", group="billing", shards=2)
async def handle(msg: Message) -> None:
    await msg.ack()
""",
    "badhandler.py": """
from streamkit import StreamKit

app = StreamKit()


@app.stream_listener(stream_prefix="orders", group="billing")
async def handle(msg, extra) -> None:
    pass
""",
    "notcallable.py": """
from streamkit import StreamKit

app = StreamKit()
app.add_listener("orders", "billing", 42)
""",
    "boom.py": "import json\n\nVALUE = 1 / 0\n",
    "missingdep.py": "import no_such_dependency_xyz  # noqa\n",
    "syntax.py": "def f(:\n    pass\n",
    "notanapp.py": "app = object()\n",
}


@dataclass(frozen=True)
class Case:
    name: str
    args: list[str]
    #: Every fragment must be in the one error line.
    fragments: list[str]
    env: dict[str, str] = field(default_factory=dict)


_UNREACHABLE_REDIS = f"redis://127.0.0.1:{free_port()}/0"

CASES = [
    Case(
        "listener cannot fill a handler parameter",
        ["run", "badhandler:app"],
        ["badhandler.py:6:", "handler handle of listener orders/billing", "typed payload"],
    ),
    Case("handler is not callable", ["run", "notcallable:app"], ["notcallable.py:4:", "callable"]),
    Case(
        "redis url without scheme",
        ["run", "good:app"],
        ["STREAMKIT_REDIS_URL='127.0.0.1:6379' is not a Redis URL", "redis://HOST:PORT/DB"],
        {"STREAMKIT_REDIS_URL": "127.0.0.1:6379"},
    ),
    Case(
        "redis url password never shown",
        ["status", "orders", "billing"],
        ["STREAMKIT_REDIS_URL='***@127.0.0.1:6379' is not a Redis URL"],
        {"STREAMKIT_REDIS_URL": "user:hunter2@127.0.0.1:6379"},
    ),
    Case(
        "username without password",
        ["status", "orders", "billing"],
        ["STREAMKIT_COORDINATOR_USERNAME is set but STREAMKIT_COORDINATOR_PASSWORD is not"],
        {"STREAMKIT_COORDINATOR_USERNAME": "admin"},
    ),
    Case(
        "password without username",
        ["stream", "list"],
        ["STREAMKIT_COORDINATOR_PASSWORD is set but STREAMKIT_COORDINATOR_USERNAME is not"],
        {"STREAMKIT_COORDINATOR_PASSWORD": "x"},
    ),
    Case(
        "blank password",
        ["group", "list"],
        ["STREAMKIT_COORDINATOR_PASSWORD is empty or blank"],
        {"STREAMKIT_COORDINATOR_USERNAME": "admin", "STREAMKIT_COORDINATOR_PASSWORD": " "},
    ),
    Case(
        "coordinator url without scheme",
        ["run", "good:app"],
        ["STREAMKIT_COORDINATOR_URL='localhost:8080' is not an HTTP URL"],
        {"STREAMKIT_COORDINATOR_URL": "localhost:8080"},
    ),
    Case(
        "unknown boolean value",
        ["dlq", "list", "orders", "billing"],
        ["STREAMKIT_REDIS_CLUSTER='maybe'", "valid boolean", "true or false"],
        {"STREAMKIT_REDIS_CLUSTER": "maybe"},
    ),
    Case(
        "number out of range",
        ["run", "good:app"],
        ["STREAMKIT_RETRY_MAX_ATTEMPTS='0'", "greater than or equal to 1"],
        {"STREAMKIT_RETRY_MAX_ATTEMPTS": "0"},
    ),
    Case(
        "settings that contradict each other",
        ["publish", "orders", "billing", "k", "a=1"],
        ["STREAMKIT_ROUTING_LEASE must exceed STREAMKIT_ROUTING_REFRESH_INTERVAL"],
        {"STREAMKIT_ROUTING_LEASE": "1"},
    ),
    Case("module not found", ["run", "nosuchmodule:app"], ["cannot import module 'nosuchmodule'"]),
    Case(
        "import raises",
        ["run", "boom:app"],
        ["boom.py:3:", "ZeroDivisionError", "STREAMKIT_DEBUG=1"],
    ),
    Case(
        "import of a missing dependency",
        ["run", "missingdep:app"],
        ["missingdep.py:1:", "No module named 'no_such_dependency_xyz'"],
    ),
    Case("syntax error", ["run", "syntax:app"], ["syntax.py:1:", "invalid syntax"]),
    Case("dev: module not found", ["dev", "nosuchmodule:app"], ["cannot import module"]),
    Case("not an app", ["run", "notanapp:app"], ["not a streamkit.StreamKit application"]),
    Case("attribute missing", ["run", "good:nope"], ["has no attribute 'nope'"]),
    Case("file name as target", ["dev", "good.py"], ["streamkit dev good:app"]),
    Case("log level", ["run", "good:app", "--log-level", "loud"], ["--log-level must be one of"]),
    Case("bad http address", ["run", "good:app", "--http", "nowhere"], ["--http", "'nowhere'"]),
    Case(
        "http with workers",
        ["run", "good:app", "--workers", "2", "--http", "127.0.0.1:1"],
        ["--http serves one process"],
    ),
    Case(
        "dlq: redis unreachable",
        ["dlq", "list", "orders", "billing"],
        ["cannot reach Redis at", "STREAMKIT_REDIS_URL sets the address"],
        {"STREAMKIT_REDIS_URL": _UNREACHABLE_REDIS},
    ),
    Case(
        "run: redis unreachable",
        ["run", "good:app"],
        ["cannot reach Redis at", "is redis-server running there?"],
        {"STREAMKIT_REDIS_URL": _UNREACHABLE_REDIS},
    ),
    Case(
        "run --workers 2: redis unreachable, said once",
        ["run", "good:app", "--workers", "2"],
        ["cannot reach Redis at", "is redis-server running there?"],
        {"STREAMKIT_REDIS_URL": _UNREACHABLE_REDIS},
    ),
    Case(
        "coordinator unreachable",
        ["stream", "create", "orders"],
        ["the coordinator at http://127.0.0.1:", "STREAMKIT_COORDINATOR_URL sets the address"],
        {"STREAMKIT_COORDINATOR_URL": f"http://127.0.0.1:{free_port()}"},
    ),
    Case("publish without fields", ["publish", "orders", "billing", "k"], ["FIELD=VALUE"]),
    Case("publish bad payload", ["publish", "o", "b", "k", "--payload", "{"], ["not JSON"]),
    Case("bad ordering", ["stream", "create", "o", "--ordering", "x"], ["--ordering must be"]),
    Case("bad max age", ["stream", "retention", "o", "--max-age", "7x"], ["--max-age", "7d"]),
    Case(
        "retention none and a bound",
        ["stream", "retention", "o", "--none", "--max-length", "5"],
        ["--none or --max-age/--max-length"],
    ),
    Case(
        "misspelt option",
        ["run", "good:app", "--wrokers", "2"],
        ["No such option: --wrokers", "--workers", "streamkit run --help"],
    ),
    Case("missing argument", ["status", "orders"], ["Missing argument", "streamkit status --help"]),
    Case("unknown command", ["sttus"], ["No such command 'sttus'"]),
    Case("option out of range", ["run", "good:app", "--workers", "0"], ["--workers"]),
]


def streamkit(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "streamkit", *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("apps")
    for name, text in APPS.items():
        (where / name).write_text(text.lstrip("\n"))
    return where


def assert_one_error_line(result: subprocess.CompletedProcess[str], fragments: list[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: "), line
    missing = [f for f in fragments if f not in line]
    assert not missing, f"{missing} not in {line!r}"
    assert "Traceback" not in result.stderr
    return line


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_start_up_failure_is_one_line(case: Case, apps: Path) -> None:
    assert_one_error_line(streamkit(case.args, apps, case.env), case.fragments)


def test_a_coordinator_url_from_a_left_over_env_file_is_named(tmp_path: Path) -> None:
    # What a killed `streamkit dev` leaves behind: the error says where the URL came from.
    (tmp_path / ".env").write_text(f"STREAMKIT_COORDINATOR_URL=http://127.0.0.1:{free_port()}\n")
    line = assert_one_error_line(
        streamkit(["stream", "create", "orders"], tmp_path), ["the coordinator at"]
    )
    assert line.endswith("(here it comes from ./.env)"), line
    # Set in the environment, the file is not what steers it.
    elsewhere = {"STREAMKIT_COORDINATOR_URL": f"http://127.0.0.1:{free_port()}"}
    line = assert_one_error_line(
        streamkit(["stream", "create", "orders"], tmp_path, elsewhere), ["the coordinator at"]
    )
    assert ".env" not in line, line


@pytest.mark.parametrize("how", ["env", "flag"])
def test_debug_shows_the_traceback(how: str, apps: Path) -> None:
    if how == "env":
        result = streamkit(["run", "boom:app"], apps, {"STREAMKIT_DEBUG": "1"})
    else:
        result = streamkit(["-v", "run", "boom:app"], apps)
    assert result.returncode != 0
    assert "Traceback (most recent call last)" in result.stderr
    assert "ZeroDivisionError" in result.stderr


# -- failures that need a coordinator ---------------------------------------------------


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_failures_against_a_coordinator(
    coordinator: Any, any_redis: RedisTarget, apps: Path
) -> None:
    prefix, group = f"errs-{uuid.uuid4().hex[:8]}", "billing"
    await create_group(coordinator, prefix, group, 2)
    env = app_env(coordinator, any_redis, base="errs", prefix=prefix, group=group, record=apps)
    # A publisher whose Redis does not answer (the coordinator does).
    result = streamkit(
        ["publish", prefix, group, "k", "a=1"],
        apps,
        {**env, "STREAMKIT_REDIS_URL": _UNREACHABLE_REDIS},
    )
    assert_one_error_line(result, ["cannot reach Redis", "STREAMKIT_REDIS_URL sets the address"])
    # No credentials at all.
    bare = {k: v for k, v in env.items() if "USERNAME" not in k and "PASSWORD" not in k}
    result = streamkit(["status", prefix, group], apps, bare)
    assert_one_error_line(result, ["401", "STREAMKIT_COORDINATOR_USERNAME"])
    # Wrong password: the client's own warning does not repeat the error line.
    wrong = {**env, "STREAMKIT_COORDINATOR_PASSWORD": "wrong"}
    result = streamkit(["group", "create", prefix, "other"], apps, wrong)
    assert_one_error_line(result, ["401", "STREAMKIT_COORDINATOR_PASSWORD"])
    # An app stops at the first refusal, before any member joins, and without
    # spending the name's budget of failed logins (10 a minute): the right
    # password, below, still logs in.
    result = streamkit(["run", "good:app"], apps, wrong)
    assert_one_error_line(result, ["401", "STREAMKIT_COORDINATOR_PASSWORD"])
    result = streamkit(["status", prefix, group], apps, wrong)
    assert_one_error_line(result, ["401", "STREAMKIT_COORDINATOR_PASSWORD"])
    # A typo in the group a publisher names.
    result = streamkit(["publish", prefix, group + "x", "k", "a=1"], apps, env)
    assert_one_error_line(result, [f"did you mean {group!r}?", "streamkit group create"])


# -- the coordinator's Redis goes away and comes back ------------------------------------


async def test_a_coordinator_whose_redis_is_down_then_back(apps: Path) -> None:
    """While the coordinator's Redis is down, commands say so in one line that
    names the fix; once it is back, the very first command works (the
    coordinator's stale pooled connection costs one retried read, not an error)."""
    from streamkit.demo.dev import client_env
    from streamkit.testing import RedisServer
    from streamkit.testing.coordinator import CoordinatorProcess

    # Persistent, so that the restarted server still holds the group.
    with RedisServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"]) as server:
        with CoordinatorProcess(server.url) as coordinator:
            await create_group(coordinator, "orders", "billing", 2)
            env = client_env(coordinator, server.url, cluster=False)
            server.kill()
            result = streamkit(["dlq", "list", "orders", "billing"], apps, env)
            line = assert_one_error_line(result, ["cannot reach Redis", "STREAMKIT_REDIS_URL"])
            assert ".;" not in line, line
            server.restart()
            result = streamkit(["status", "orders", "billing"], apps, env)
            assert result.returncode == 0, result.stderr
            assert "orders/billing" in result.stdout
            server.kill()
            result = streamkit(["status", "orders", "billing"], apps, env)
            assert_one_error_line(
                result, ["503", "REDIS_UNAVAILABLE", "is redis-server running there?",
                         "STREAMKIT_SERVER_REDIS_URL"]
            )  # fmt: skip
