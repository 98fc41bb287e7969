"""``streamkit run --http``: /healthz, /readyz and /metrics of a real process, with
real Redis and a real coordinator; /readyz answers 503 while SIGTERM drains."""

from __future__ import annotations

import re
import signal
from typing import Any

import anyio
import httpx
import pytest

from streamkit.observability.probes import parse_address
from streamkit.testing import free_port

from .support import Admin, eventually

SHARDS = 2


def _sample(text: str, name: str) -> float:
    """The sum of every sample of ``name`` (across label sets)."""
    return sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M))


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_http_probes_and_metrics_of_a_running_app(
    admin: Admin, redis: Any, names: tuple[str, str], app_process: Any
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, SHARDS)
    port = free_port()
    app = app_process("probe", prefix, group, sleep_ms=200, args=("--http", f"127.0.0.1:{port}"))
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, timeout=2) as http:

        async def get(path: str) -> httpx.Response | None:
            try:
                return await http.get(path)
            except httpx.TransportError:
                return None

        async def status(path: str) -> int:
            response = await get(path)
            return 0 if response is None else response.status_code

        with anyio.fail_after(40):
            await eventually(
                lambda: _is(status("/healthz"), 200),
                20,
                "/healthz up",
            )
            await eventually(lambda: _is(status("/readyz"), 200), 20, "/readyz ready")
            for i in range(20):
                await redis.xadd(f"{prefix}:{i % SHARDS}", {"n": str(i)})

            async def handled() -> bool:
                response = await get("/metrics")
                text = response.text if response is not None else ""
                return (
                    _sample(text, "streamkit_consumer_entries_handled_total") >= 2
                    and _sample(text, "streamkit_member_owned_shards") == SHARDS
                )

            await eventually(handled, 20, "/metrics: handled entries and owned shards")
            assert await status("/nope") == 404
            assert app.proc is not None
            app.proc.send_signal(signal.SIGTERM)
            # The drain waits for the running handler (200 ms): not ready meanwhile.
            await eventually(lambda: _is(status("/readyz"), 503), 5, "/readyz 503 while draining")
            assert await app.wait(20) == 0, app.logs()


async def _is(awaitable: Any, expected: int) -> bool:
    return bool(await awaitable == expected)


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address("[::1]:80") == ("::1", 80)
    for bad in ("9464", ":80", "host:", "host:99999", "host:x", "host:\u00b9"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_address(bad)
