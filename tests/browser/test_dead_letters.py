"""The console's dead letters and API pages in a real browser.

A real ``streamkit run`` consumer (tests/consumer/apps/failing.py) fails the
entries that carry a ``poison`` field until a "healed" file exists, so its
failure policy dead-letters them; the page lists them, a WRITE user replays
one after the fix and the consumer handles it, a READ user cannot press
Replay, and the API page shows the coordinator's per-route figures.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from consumer.support import AppProcess, app_env
from playwright.sync_api import expect

from streamkit.consumer.failure import dead_letter_key
from streamkit.routing import shard_for_key
from streamkit.testing import RedisServer, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

from .conftest import BrowserErrors
from .test_console import sign_in
from .tokens import read_only_token

pytestmark = [pytest.mark.slow, pytest.mark.redis]

Page = Any  # playwright.sync_api.Page
SHARDS = 2
POISON = ("o-7", "o-8", "o-9")


@dataclass
class DlqStack:
    coordinator: CoordinatorProcess
    redis: redis.Redis
    prefix: str
    group: str
    record: Path
    healed: Path

    @property
    def console_url(self) -> str:
        return f"{self.coordinator.url}/console/?poll=300"

    def handled(self) -> str:
        return self.record.read_text() if self.record.exists() else ""


@pytest.fixture(scope="module")
def dlq(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DlqStack]:
    """A coordinator, a 2-shard group and a consumer that dead-letters the poison entries."""
    redis_server.flushall()
    prefix, group = f"payments-{uuid.uuid4().hex[:6]}", "ledger"
    tmp = tmp_path_factory.mktemp("dlq")
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    with CoordinatorProcess(redis_server.url) as coordinator:
        reply = httpx.post(
            f"{coordinator.url}/coord/v1/streams/{prefix}/groups/{group}",
            json={"initialShardCount": SHARDS, "requestedBy": "tests", "reason": "dlq console"},
            auth=coordinator.admin_auth,
            timeout=10,
        )
        assert reply.status_code == 201, reply.text
        # Routed as a Publisher routes them (identity layout).
        for n in range(12):
            order = f"o-{n}"
            fields = {"orderId": order, "amount": str(n)}
            if order in POISON:
                fields["poison"] = "1"
            client.xadd(f"{prefix}:{shard_for_key(order, SHARDS)}", fields)
        stack = DlqStack(coordinator, client, prefix, group, tmp / "failing.rec", tmp / "healed")
        env = app_env(
            coordinator, RedisTarget(url=redis_server.url, cluster=False), base="ledger",
            prefix=prefix, group=group, record=stack.record, max_attempts=2, backoff_ms=50,
            healed=stack.healed,
        )  # fmt: skip
        app = AppProcess("tests.consumer.apps.failing:app", env, tmp / "failing.log").start()
        try:
            deadline = time.monotonic() + 30
            while client.xlen(dead_letter_key(prefix, group)) < len(POISON):
                app.assert_running()
                assert time.monotonic() < deadline, app.logs()
                time.sleep(0.1)
            yield stack
        finally:
            app.cleanup()
            client.close()


def open_group(page: Page, dlq: DlqStack) -> None:
    page.get_by_role("link", name=dlq.group).click()
    expect(page.locator("#group-title")).to_have_text(f"{dlq.prefix} / {dlq.group}")


def test_dead_letters_are_listed_and_a_replay_is_handled(
    page: Page, dlq: DlqStack, browser_errors: BrowserErrors, screenshots: Path
) -> None:
    sign_in(page, dlq)  # type: ignore[arg-type]
    open_group(page, dlq)
    rows = page.locator("#dlq-table tbody tr")
    expect(rows).to_have_count(len(POISON))
    expect(page.locator("#dlq-where")).to_contain_text(
        f"{dlq.prefix}/dlq/{dlq.group}: {len(POISON)} dead letters"
    )
    first = rows.first
    expect(first).to_contain_text("RuntimeError: poison")
    expect(first.locator("td").nth(3)).to_have_text("2")  # attempts: SKT_MAX_ATTEMPTS
    expect(first).to_contain_text("poison=1")
    texts = " ".join(rows.all_inner_texts())
    assert all(f"orderId={o}" in texts for o in POISON), texts
    page.locator("#dlq-heading").evaluate("e => e.scrollIntoView({block: 'start'})")
    page.screenshot(path=str(screenshots / "console-dead-letters.png"))

    # A refusal shows the API's answer and keeps the entry: no such field.
    target = first.get_attribute("data-id")
    page.get_by_label("Route by entry field").fill("customerId")
    page.get_by_role("button", name=f"Replay {target}").click()
    page.get_by_role("button", name="Replay", exact=True).click()
    expect(page.locator("#dlq-error")).to_contain_text("DEAD_LETTER_NOT_REPLAYED")
    expect(page.locator("#dlq-error")).to_contain_text("customerId")
    browser_errors.allow_http(422)
    expect(rows).to_have_count(len(POISON))

    # The handler is fixed; Cancel changes nothing, Replay publishes it again.
    dlq.healed.touch()
    page.get_by_label("Route by entry field").fill("orderId")
    page.get_by_role("button", name=f"Replay {target}").click()
    page.keyboard.press("Escape")
    expect(rows).to_have_count(len(POISON))
    page.get_by_role("button", name=f"Replay {target}").click()
    dialog = page.locator("#confirm")
    expect(dialog).to_contain_text("routed by its field orderId")
    page.get_by_role("button", name="Replay", exact=True).click()
    note = page.locator("#dlq-note")
    expect(note).to_contain_text(f"Replayed {target} to {dlq.prefix}:")
    expect(rows).to_have_count(len(POISON) - 1)
    expect(page.locator(f'#dlq-table tr[data-id="{target}"]')).to_have_count(0)
    expect(page.locator("#dlq-error")).to_be_hidden()
    where = re.search(r" to (\S+)/(\S+)\.$", note.inner_text())
    assert where, note.inner_text()
    new_entry = f"{where[1]}/{where[2]}"
    deadline = time.monotonic() + 15
    while f"H {new_entry} " not in dlq.handled():
        assert time.monotonic() < deadline, f"{new_entry} was not handled:\n{dlq.handled()}"
        time.sleep(0.1)
    assert dlq.redis.xlen(dead_letter_key(dlq.prefix, dlq.group)) == len(POISON) - 1


def test_read_only_user_cannot_replay(page: Page, dlq: DlqStack) -> None:
    page.goto(dlq.console_url)
    page.evaluate(
        "t => sessionStorage.setItem('streamkit.console.token', t)", read_only_token("viewer")
    )
    page.reload()
    open_group(page, dlq)
    buttons = page.locator("#dlq-table button.replay")
    expect(buttons).to_have_count(len(POISON) - 1)
    for button in buttons.all():
        expect(button).to_be_disabled()
    expect(page.get_by_label("Route by entry field")).to_be_disabled()
    expect(page.locator("#dlq-note")).to_contain_text("read access only")


def test_api_performance_page_updates_live(page: Page, dlq: DlqStack, screenshots: Path) -> None:
    sign_in(page, dlq)  # type: ignore[arg-type]
    page.get_by_role("link", name="API performance").click()
    health = page.locator('#api-table tr[data-route="getCoordinatorHealth"]')
    count = health.locator('[data-col="count"]')
    expect(count).to_have_text(re.compile(r"^[1-9][\d,]*$"))
    before = count.inner_text()
    # The page's own polling calls the route again: the figure moves without a reload.
    expect(count).not_to_have_text(before)
    expect(health.locator("td").nth(3)).to_have_text(re.compile(r"^\d+\.\d$"))  # req/s
    expect(health.locator("td").nth(7)).to_have_text(re.compile(r"^\d"))  # p50
    # The replays of the previous test: one refused (4xx), one done.
    replay = page.locator('#api-table tr[data-route="replayDeadLetter"]')
    expect(replay.locator("td").nth(4)).to_have_text(re.compile(r"^[1-9]"))
    expect(page.locator('#api-table tr[data-route="sendConsumerHeartbeat"]')).to_have_count(1)
    page.screenshot(path=str(screenshots / "console-api.png"))
