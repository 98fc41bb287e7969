"""Scaffolding shared by the test packages: polling, the admin API, app processes, keys.

One copy of each: the consumer, producer, resharding, server and samples tests
all poll with ``eventually``, create groups through ``create_group`` (or
``Admin``), name metadata keys with ``metadata_key``, start ``streamkit run``
processes with ``AppProcess`` (and stop other children with
``sigterm_then_kill``), configure in-process clients with
``in_process_settings`` and send a member's first heartbeat as ``join_body``.
The docs tests check settings tables with ``assert_same_settings`` and
``setting_row``.  A TCP path to cut or hold is ``tcp_forwarder.TcpForwarder``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx

from streamkit.protocol import (
    AssignmentsResponse,
    ConsumptionProgressResponse,
    MemberListResponse,
    shard_indexes,
)
from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit.testing.process import ManagedProcess

REPO = Path(__file__).resolve().parents[1]
API = "/coord/v1"
#: The coordinator's default Redis key prefix (``STREAMKIT_SERVER_KEY_PREFIX``).
KEY_PREFIX = "redis-stream:coord"


def metadata_key(prefix: str, group: str, key_prefix: str = KEY_PREFIX) -> str:
    """The Redis hash holding a group's metadata (one hash slot per group)."""
    return f"{key_prefix}:{{{prefix}:{group}}}:metadata"


_INCARNATION_PART = re.compile(r"-[0-9a-f]{8}(?=-m\d+\b)")


def logical(member_id: str) -> str:
    """``a-1f2e3d4c-m0`` -> ``a-m0``: a member id (or text) without the per-start part.

    Tests name processes by ``STREAMKIT_MEMBER_ID_BASE``; each start of a
    process adds a random part to its member ids (see ``member_id_prefix``).
    """
    return _INCARNATION_PART.sub("", member_id)


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    within: float = 5.0,
    what: str = "the condition",
    interval: float = 0.05,
    details: Callable[[], str] | None = None,
) -> None:
    """Poll ``check`` (sync or async) until true; fail naming ``what`` after ``within`` s.

    ``details`` adds context to the failure (process logs, for example).
    """
    deadline = time.monotonic() + within
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            extra = f"\n{details()}" if details is not None else ""
            raise AssertionError(f"timed out after {within:.1f}s waiting for {what}{extra}")
        await anyio.sleep(interval)


async def create_group(
    coordinator: CoordinatorProcess,
    prefix: str,
    group: str,
    shards: int | None = None,
    *,
    http: httpx.AsyncClient | None = None,
) -> dict[str, Any]:
    """``POST /streams/{prefix}/groups/{group}`` as the admin; asserts 201."""
    return await Admin(coordinator, http).create_group(prefix, group, shards)


def join_body(member: str = "m1", **changes: Any) -> dict[str, Any]:
    """The JSON of a member's first heartbeat (epoch 0, metadata version 0, one
    slot); ``changes`` replace fields, and a ``None`` removes one."""
    body: dict[str, Any] = {
        "protocolVersion": 1,
        "requestId": "r",
        "memberId": member,
        "memberEpoch": 0,
        "metadataVersion": 0,
        "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1},
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not None}


def in_process_settings(
    coordinator: CoordinatorProcess, target: RedisTarget, base: str
) -> dict[str, Any]:
    """``StreamKit(**...)`` keyword overrides for an app inside the test process."""
    user, password = coordinator.admin_auth
    return {
        "coordinator_url": coordinator.url,
        "coordinator_username": user,
        "coordinator_password": password,
        "redis_url": target.url,
        "redis_cluster": target.cluster,
        "member_id_base": base,
    }


class Admin:
    """The coordinator's admin and monitoring API, over real HTTP.

    Uses ``http`` when given (a test's shared client), else a client per call.
    """

    def __init__(self, coordinator: CoordinatorProcess, http: httpx.AsyncClient | None = None):
        self.coordinator = coordinator
        self.http = http

    @property
    def url(self) -> str:
        return self.coordinator.url

    @property
    def auth(self) -> tuple[str, str]:
        return self.coordinator.admin_auth

    async def request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        url = f"{self.url}{API}{path}"
        if self.http is not None:
            return await self.http.request(method, url, json=body, auth=self.auth, timeout=15)
        async with httpx.AsyncClient(timeout=15) as http:
            return await http.request(method, url, json=body, auth=self.auth)

    async def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self.request("POST", path, body)

    async def get(self, path: str) -> httpx.Response:
        return await self.request("GET", path)

    async def get_json(self, path: str) -> Any:
        r = await self.get(path)
        assert r.status_code == 200, r.text
        return r.json()

    async def create_stream(self, prefix: str, shards: int, **extra: Any) -> None:
        r = await self.post(
            f"/streams/{prefix}", {"initialShardCount": shards, "requestedBy": "t", **extra}
        )
        assert r.status_code == 201, r.text

    async def create_group(
        self, prefix: str, group: str, shards: int | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"requestedBy": "tests", "reason": "tests"}
        if shards is not None:
            body["initialShardCount"] = shards
        r = await self.post(f"/streams/{prefix}/groups/{group}", body)
        assert r.status_code == 201, r.text
        created: dict[str, Any] = r.json()
        return created

    def _monitoring(self, prefix: str, group: str, view: str) -> str:
        return f"/monitoring/streams/{prefix}/groups/{group}/{view}"

    async def owners(self, prefix: str, group: str, *, raw: bool = False) -> dict[str, list[int]]:
        """memberId -> shards it currently holds (current assignment).

        Member ids are ``logical`` unless ``raw``.
        """
        body = AssignmentsResponse.from_wire(
            await self.get_json(self._monitoring(prefix, group, "assignments"))
        )
        name = (lambda m: m) if raw else logical
        return {name(m): shard_indexes(s) for m, s in body.current_assignments.items() if s}

    async def targets(self, prefix: str, group: str) -> dict[str, list[int]]:
        """memberId (``logical``) -> its target shards."""
        body = AssignmentsResponse.from_wire(
            await self.get_json(self._monitoring(prefix, group, "assignments"))
        )
        return {logical(m): shard_indexes(s) for m, s in body.target_assignment.items() if s}

    async def consumption(self, prefix: str, group: str) -> ConsumptionProgressResponse:
        return ConsumptionProgressResponse.from_wire(
            await self.get_json(self._monitoring(prefix, group, "consumption"))
        )

    async def members(self, prefix: str, group: str) -> MemberListResponse:
        return MemberListResponse.from_wire(
            await self.get_json(self._monitoring(prefix, group, "members"))
        )


async def sigterm_then_kill(proc: subprocess.Popen[bytes], within: float = 10.0) -> None:
    """SIGTERM ``proc``; SIGKILL it if it is still running ``within`` s later."""
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + within
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(5)
            return
        await anyio.sleep(0.05)


class AppProcess(ManagedProcess):
    """``python -m streamkit run <target>`` as a real process, output in a file.

    ``runner`` names another command that takes the target (``("uvicorn",)``).
    """

    def __init__(
        self,
        target: str,
        env: Mapping[str, str],
        log_path: Path,
        args: Iterable[str] = (),
        *,
        runner: Sequence[str] = ("streamkit", "run"),
    ) -> None:
        super().__init__(log_path)
        self.runner = tuple(runner)
        self.target = target
        self.args = list(args)
        self.env = dict(env)
        #: monotonic ns at which the process was known dead (after kill/exit).
        self.died_ns: int | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self._proc

    def start(self) -> AppProcess:
        env = dict(os.environ)
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        self._spawn(
            [sys.executable, "-m", *self.runner, self.target, *self.args], env=env, cwd=REPO
        )
        self.died_ns = None
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def running(self) -> bool:
        return self.is_running()

    def assert_running(self) -> None:
        assert self.running(), f"{self.target} exited early:\n{self.logs(None)}"

    def kill(self) -> None:
        """SIGKILL: a crash, nothing runs on the way out."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGKILL)
        self._proc.wait(10)
        self.died_ns = time.monotonic_ns()

    async def terminate(self, within: float = 20.0) -> int:
        """SIGTERM and wait for the exit status without blocking the loop."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGTERM)
        return await self.wait(within)

    async def wait(self, within: float) -> int:
        assert self._proc is not None
        deadline = time.monotonic() + within
        while self._proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.target} did not exit in {within}s:\n{self.logs()}")
            await anyio.sleep(0.02)
        self.died_ns = time.monotonic_ns()
        return self._proc.returncode

    def cleanup(self) -> None:
        """Kill the process (by its pid) if a failed assertion left it running."""
        if self.running():
            assert self._proc is not None
            self._proc.kill()
            self._proc.wait(10)
        self._unregister()

    def logs(self, lines: int | None = 80) -> str:
        """The last ``lines`` lines of its output (all of it with ``None``)."""
        return super().logs(lines)


# -- markdown tables (the docs tests) -----------------------------------------------------


def table_cells(line: str) -> list[str]:
    """The cells of a markdown table row, without surrounding backticks."""
    inner = line.strip().strip("|")
    return [cell.strip().strip("`").strip() for cell in re.split(r"(?<!\\)\|", inner)]


def table_rows(path: Path, first_cell: re.Pattern[str]) -> dict[str, list[str]]:
    """The rows of every table in ``path`` whose first cell matches, by that cell."""
    rows: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        cells = table_cells(line)
        if cells and first_cell.fullmatch(cells[0]):
            assert cells[0] not in rows, f"{path.name}: {cells[0]} appears in two table rows"
            rows[cells[0]] = cells
    return rows


def assert_same_settings(documented: Iterable[str], expected: Iterable[str], page: str) -> None:
    """A settings table of ``page`` names every setting of the code and no other."""
    missing = sorted(set(expected) - set(documented))
    unknown = sorted(set(documented) - set(expected))
    assert not missing, f"{page} lacks settings {missing}"
    assert not unknown, f"{page} documents settings that do not exist: {unknown}"


def setting_row(rows: Mapping[str, list[str]], env: str, page: str, cells: int) -> list[str]:
    """The row of setting ``env`` in a settings table of ``page``, with ``cells`` cells."""
    row = rows.get(env)
    assert row is not None, f"{env} is missing from {page}"
    assert len(row) == cells, f"row of {env} should have {cells} cells: {row}"
    return row
