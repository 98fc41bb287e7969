"""samples/web_orders over real HTTP: uvicorn on a loopback port runs the FastAPI app,
whose lifespan serves the StreamKit listener; real Redis and a real coordinator come
from the pytest plugin's fixtures (``streamkit_harness``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from streamkit.testing import free_port
from streamkit.testing.harness import StreamKitHarness
from streamkit.testing.redis_server import _die_with_parent_hook

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.mark.streamkit(shards=2, group="fulfilment")
async def test_post_publishes_and_the_listener_handles(
    streamkit_harness: StreamKitHarness, tmp_path: Path
) -> None:
    harness = streamkit_harness
    port = free_port()
    user, password = harness.coordinator.admin_auth
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "STREAMKIT_COORDINATOR_URL": harness.coordinator.url,
        "STREAMKIT_COORDINATOR_USERNAME": user,
        "STREAMKIT_COORDINATOR_PASSWORD": password,
        "STREAMKIT_REDIS_URL": harness.redis_url,
        "WEB_ORDERS_PREFIX": harness.stream_prefix,
        "WEB_ORDERS_GROUP": harness.group,
    }
    log_path = tmp_path / "uvicorn.log"
    proc = _start_uvicorn(port, env, log_path)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            with anyio.fail_after(30):
                while True:  # uvicorn listens only after the lifespan's start-up
                    try:
                        response = await http.post(
                            "/orders", json={"order_id": "o-1", "item": "tea", "quantity": 2}
                        )
                        break
                    except httpx.TransportError:
                        assert proc.poll() is None, log_path.read_text()
                        await anyio.sleep(0.05)
                assert response.status_code == 202, response.text
                assert response.json()["entry"].startswith(f"{harness.stream_prefix}:")
                bad = await http.post("/orders", json={"order_id": "", "item": "x", "quantity": 0})
                assert bad.status_code == 422
                await harness.drain()
                status = await http.get("/orders/o-1")
                assert status.status_code == 200, status.text
                assert status.json() == {"order_id": "o-1", "handled": "2x tea"}
                assert (await http.get("/orders/o-2")).status_code == 404
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(20):
            while proc.poll() is None:  # noqa: ASYNC110 (a child process has no event)
                await anyio.sleep(0.05)
        # uvicorn re-raises the SIGTERM after a clean shutdown.
        assert proc.returncode in (0, -signal.SIGTERM), log_path.read_text()
        assert "Application shutdown complete" in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _start_uvicorn(port: int, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "samples.web_orders.app:web",
             "--host", "127.0.0.1", "--port", str(port), "--lifespan", "on"],
            env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent_hook(),
        )  # fmt: skip
