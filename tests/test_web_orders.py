"""samples/web_orders over real HTTP: uvicorn on a loopback port runs the FastAPI app,
whose lifespan serves the StreamKit listener; real Redis and a real coordinator come
from the pytest plugin's fixtures (``streamkit_harness``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest
from helpers import REPO, AppProcess

from streamkit.testing import free_port
from streamkit.testing.harness import StreamKitHarness

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
    proc = AppProcess(
        "samples.web_orders.app:web",
        env,
        log_path,
        ("--host", "127.0.0.1", "--port", str(port), "--lifespan", "on"),
        runner=("uvicorn",),
    ).start()
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
                        proc.assert_running()
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
        code = await proc.terminate(within=20)
        # uvicorn re-raises the SIGTERM after a clean shutdown.
        assert code in (0, -signal.SIGTERM), proc.logs(None)
        assert "Application shutdown complete" in proc.logs(None)
    finally:
        proc.cleanup()
