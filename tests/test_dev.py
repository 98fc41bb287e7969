"""``streamkit dev samples.orders.app:app``: from nothing to a handled order.

Exactly the command of the getting-started guide's first path, as a user runs
it from the checkout: it starts its own Redis and coordinator, creates the
streams the sample declares, and serves the sample.  An order published with
the settings it prints is billed; Ctrl-C leaves no process and no port.
(How fast is measured by ``bench/cli.py``, not asserted here.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

import anyio
import httpx
import pytest
import redis
from helpers import REPO

from samples.orders.app import BILLING, ORDERS, Order, OrderRepository
from streamkit import Publisher
from streamkit.demo.dev import _check_settings_file
from streamkit.settings import StreamKitSettings
from streamkit.testing import free_port

pytestmark = pytest.mark.redis  # starts redis-server (through the command)


def _command() -> list[str]:
    script = Path(sys.executable).with_name("streamkit")
    return [str(script)] if script.exists() else [sys.executable, "-m", "streamkit"]


def _wait_for_line(proc: subprocess.Popen[str], pattern: str, within: float) -> re.Match[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + within
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError(f"no line matching {pattern!r}:\n{''.join(seen)}")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie that init has not reaped yet counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z")


def _until(check: Callable[[], bool], within: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {within:.0f}s:\n{log.read_text()}"
        time.sleep(0.1)


async def _publish(settings: StreamKitSettings, order: Order) -> None:
    async with Publisher(ORDERS, BILLING, settings=settings) as publisher:
        await publisher.publish(order.order_id, order)


def _user_env() -> dict[str, str]:
    """The user's environment without ``STREAMKIT_*`` settings, output unbuffered."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextmanager
def _dev(*args: str, cwd: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[str]]:
    """``streamkit dev ARGS`` in a session of its own (as in a terminal), its
    stderr in ``log``; SIGKILLed with its group if a failure leaves it running."""
    with open(log, "w") as errors:
        proc = subprocess.Popen(
            [*_command(), "dev", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _interrupt(proc: subprocess.Popen[str], log: Path) -> None:
    """Ctrl-C in the terminal: SIGINT to the command's process group; it exits 0."""
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(60) == 0, log.read_text()


def test_dev_handles_a_published_order_and_leaves_nothing_behind(tmp_path: Path) -> None:
    log = tmp_path / "dev.err"
    with _dev("samples.orders.app:app", cwd=REPO, env=_user_env(), log=log) as proc:
        exports = _wait_for_line(proc, r"^export (.*)$", within=60)[1]
        settings = dict(item.split("=", 1) for item in exports.split())
        coordinator_url = settings["STREAMKIT_COORDINATOR_URL"]
        redis_url = settings["STREAMKIT_REDIS_URL"]
        client_settings = StreamKitSettings(
            **{k.removeprefix("STREAMKIT_").lower(): v for k, v in settings.items()}
        )
        _until(lambda: "assigned shards" in log.read_text(), 60, "shards for the sample", log)
        order = Order(order_id="order-dev-1", amount=Decimal("9.50"))
        anyio.run(_publish, client_settings, order)
        data = redis.Redis.from_url(redis_url)
        try:
            billed = lambda: bool(data.sismember(OrderRepository.BILLED, order.order_id))  # noqa: E731
            _until(billed, 30, "billed order", log)
            redis_pid = int(data.info("server")["process_id"])
        finally:
            data.close()
        coordinator_pid = int(httpx.get(f"{coordinator_url}/healthz").json()["pid"])
        _interrupt(proc, log)
    text = log.read_text()
    assert "left the group" in text and "stopped the app, the coordinator and Redis" in text, text
    assert "Traceback" not in text, text
    _until(
        lambda: _gone(redis_pid) and _gone(coordinator_pid),
        10,
        "exit of Redis and the coordinator",
        log,
    )
    for url in (coordinator_url, redis_url):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/", timeout=2)


_TINY_APP = """
from streamkit import Message, StreamKit

app = StreamKit()


@app.stream_listener(stream_prefix="hello", group="printer", shards=2)
async def greet(msg: Message) -> None:
    await msg.ack()
"""


def _second(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_command(), "dev", "tiny:app", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_dev_in_the_same_place_refuses_and_leaves_the_first_alone(
    tmp_path: Path,
) -> None:
    """Same directory and settings file, then same port: one ``error:`` line each,
    before any Redis starts, and the first one's file and coordinator untouched."""
    (tmp_path / "tiny.py").write_text(_TINY_APP)
    env = _user_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    port = free_port()
    log = tmp_path / "first.err"
    args = ("tiny:app", "--env-file", ".env", "--port", str(port))
    with _dev(*args, cwd=tmp_path, env=env, log=log) as first:
        _wait_for_line(first, r"^\(also written to \.env", within=60)
        settings_file = (tmp_path / ".env").read_text()
        assert f"# pid {first.pid}\n" in settings_file
        same_file = _second(tmp_path, env, "--env-file", ".env")
        line = _one_error_line(same_file)
        assert f"belongs to the streamkit dev running as pid {first.pid}" in line, line
        assert "streamkit run tiny:app" in line and "another --env-file" in line, line
        same_port = _second(tmp_path, env, "--port", str(port))
        line = _one_error_line(same_port)
        assert f"port {port} is taken" in line and "--port" in line, line
        # The first is unharmed: its file, its coordinator and its app.
        assert (tmp_path / ".env").read_text() == settings_file
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").json()["pid"] != first.pid
        assert first.poll() is None
        _interrupt(first, log)
    assert not (tmp_path / ".env").exists(), "the first removes its file when it stops"
    # A file left by a dev that was killed (or whose pid now runs something else)
    # is replaced, not refused.
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            for pid in (999_999_999, other.pid):
                stale = settings_file.replace(f"pid {first.pid}", f"pid {pid}")
                (tmp_path / ".env").write_text(stale)
                assert _check_settings_file(tmp_path / ".env", "tiny:app")  # stale
        finally:
            other.kill()


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "streamkit dev:" not in result.stdout, "nothing started before the refusal"
    return lines[0]
