"""Fixtures of the console tests: Debian's Chromium driven by Playwright, against a
real coordinator, real Redis and real ``streamkit run`` consumers.

Chromium missing is a failure, not a skip: ``scripts/setup.sh`` installs it.

Screenshots go to a temporary directory, so a test run leaves the checkout
clean; with ``STREAMKIT_UPDATE_SCREENSHOTS=1`` they replace the ones in
``docs/img/`` that docs/console.md shows.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
from consumer.support import AppProcess, app_env

from streamkit.testing import RedisServer, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHARDS = 4
# A short producer routing lease lets a scale reach DEPRECATED in seconds,
# while staying long enough for the page to show it ACTIVE first and for the
# rollback test to press Roll back before the migration ends.
ROUTING_LEASE_MS = 5_000
REPO = Path(__file__).resolve().parents[2]
DOCS_IMG = REPO / "docs" / "img"


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the tests write screenshots: docs/img/ only when asked to refresh them."""
    if os.environ.get("STREAMKIT_UPDATE_SCREENSHOTS") == "1":
        return DOCS_IMG
    return tmp_path_factory.mktemp("screenshots")


@dataclass
class Stack:
    coordinator: CoordinatorProcess
    redis_url: str
    prefix: str
    group: str
    consumers: dict[str, AppProcess] = field(default_factory=dict)

    @property
    def console_url(self) -> str:
        # A faster poll than the default keeps the tests short.
        return f"{self.coordinator.url}/console/?poll=300"


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A coordinator, a 4-shard group with entries, and two consumer processes."""
    # Groups other tests left behind would be listed (and polled) too.
    redis_server.flushall()
    prefix, group = f"orders-{uuid.uuid4().hex[:6]}", "billing"
    tmp = tmp_path_factory.mktemp("console")
    coordinator = CoordinatorProcess(
        redis_server.url,
        env={"STREAMKIT_SERVER_PRODUCER_ROUTING_LEASE_MS": str(ROUTING_LEASE_MS)},
    )
    with coordinator:
        reply = httpx.post(
            f"{coordinator.url}/coord/v1/streams/{prefix}/groups/{group}",
            json={"initialShardCount": SHARDS, "requestedBy": "tests", "reason": "console"},
            auth=coordinator.admin_auth,
            timeout=10,
        )
        assert reply.status_code == 201, reply.text
        client = redis.Redis.from_url(redis_server.url)
        try:
            for shard in range(SHARDS):
                for n in range(30):
                    client.xadd(
                        f"{prefix}:{shard}", {"orderId": f"o-{shard}-{n}", "amount": str(n)}
                    )
        finally:
            client.close()
        result = Stack(coordinator, redis_server.url, prefix, group)
        target = RedisTarget(url=redis_server.url, cluster=False)
        try:
            for base in ("consumer-a", "consumer-b"):
                env = app_env(
                    coordinator, target, base=base, prefix=prefix, group=group,
                    record=tmp / f"{base}.rec",
                )  # fmt: skip
                app = AppProcess("tests.consumer.apps.recording:app", env, tmp / f"{base}.log")
                result.consumers[base] = app.start()
            yield result
        finally:
            for app in result.consumers.values():
                app.cleanup()


# Module scope, not session: Playwright's sync API keeps an event loop running
# in this thread while it is started, and the async tests that an xdist worker
# runs after these modules could not start theirs.
@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the console tests need Debian's chromium "
            "(run scripts/setup.sh, or apt-get install chromium)",
            pytrace=False,
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class BrowserErrors(list[str]):
    """Console errors and uncaught exceptions of one page."""

    def __init__(self) -> None:
        super().__init__()
        self._allowed: list[re.Pattern[str]] = []

    def allow_http(self, status: int) -> None:
        """Ignore Chromium's own log lines for an API answer the test expects,
        from now until the end of the test (a polling page repeats them)."""
        self._allowed.append(re.compile(rf"Failed to load resource: .*status of {status}\b"))
        self[:] = self.unexpected()

    def unexpected(self) -> list[str]:
        return [e for e in self if not any(p.search(e) for p in self._allowed)]


@pytest.fixture
def browser_errors() -> BrowserErrors:
    return BrowserErrors()


@pytest.fixture
def page(browser: object, browser_errors: BrowserErrors) -> Iterator[object]:
    """A fresh tab at 1280x800; fails the test if the page logged an error."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})  # type: ignore[attr-defined]
    tab = context.new_page()
    tab.set_default_timeout(20_000)
    tab.on("console", lambda m: browser_errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda exc: browser_errors.append(f"uncaught: {exc}"))
    try:
        yield tab
    finally:
        context.close()
    unexpected = browser_errors.unexpected()
    assert unexpected == [], f"the page logged errors: {unexpected}"
