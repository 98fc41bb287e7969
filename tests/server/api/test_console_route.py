"""The console's static files and settings route over real HTTP (no browser)."""

from __future__ import annotations

import re

import httpx
import pytest
from coordinator_fixtures import CoordinatorPool

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import TEST_TOKEN_SECRET, CoordinatorProcess
from streamkit_server.api.console import CONSOLE_DIR
from streamkit_server.auth.security import Authenticator, Principal, Role


def _token(*roles: Role) -> str:
    signer = Authenticator("-", "-", TEST_TOKEN_SECRET.encode(), 600)
    return signer.issue(Principal("svc", frozenset(roles), "bearer"))[0]


@pytest.fixture
def coord(redis_url: str, coordinator_pool: CoordinatorPool) -> CoordinatorProcess:
    return coordinator_pool.get(
        RedisTarget(redis_url, cluster=False),
        env={"STREAMKIT_SERVER_PRODUCER_ROUTING_LEASE_MS": "4321"},
    )


async def test_console_page_is_served_with_a_strict_policy(coord: CoordinatorProcess) -> None:
    async with httpx.AsyncClient(base_url=coord.url) as http:
        bare = await http.get("/console")
        assert bare.status_code == 308 and bare.headers["location"] == "/console/"
        page = await http.get("/console/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert '<script src="console.js"' in page.text
        for name, kind in (("console.js", "javascript"), ("console.css", "text/css")):
            asset = await http.get(f"/console/{name}")
            assert asset.status_code == 200 and kind in asset.headers["content-type"], name
            assert asset.text == (CONSOLE_DIR / name).read_text(encoding="utf-8")
        missing = await http.get("/console/nope.js")
        assert missing.status_code == 404 and missing.json()["errorCode"] == "NOT_FOUND"
        # Static files are read-only: other methods are refused, not served.
        assert (await http.post("/console/console.js")).status_code == 405
        schema = (await http.get("/openapi.json")).json()
        assert not [p for p in schema["paths"] if p.startswith("/console")]


def test_console_files_load_nothing_from_elsewhere() -> None:
    # No CDN: the machines running the coordinator may have no internet.
    for path in sorted(CONSOLE_DIR.iterdir()):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), path.name


async def test_console_settings_need_read_and_report_the_timings(
    coord: CoordinatorProcess,
) -> None:
    async with httpx.AsyncClient(base_url=coord.url) as http:
        anonymous = await http.get("/console/settings.json")
        assert anonymous.status_code == 401
        assert anonymous.json()["errorCode"] == "UNAUTHORIZED"
        member_only = await http.get(
            "/console/settings.json", headers={"Authorization": f"Bearer {_token(Role.MEMBER)}"}
        )
        assert member_only.status_code == 403
        assert member_only.json()["errorCode"] == "FORBIDDEN"
        reader = await http.get(
            "/console/settings.json", headers={"Authorization": f"Bearer {_token(Role.READ)}"}
        )
        assert reader.status_code == 200
        # The launcher's test timings, and the lease given to this process.
        assert reader.json() == {
            "heartbeatIntervalMs": 200,
            "memberLeaseTtlMs": 1500,
            "rebalanceTimeoutMs": 3000,
            "producerRoutingLeaseMs": 4321,
            "tickIntervalMs": 100,
        }
