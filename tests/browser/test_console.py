"""The console in a real browser against a real coordinator, Redis and consumers.

The tests of this module share one stack and run in order: sign-in, the
shard grid, a READ-only caller, a scale 4 -> 6, a rollback, a killed
consumer.  Screenshots for docs/console.md are written on the way (see the
``screenshots`` fixture).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from streamkit.testing.coordinator import TEST_ADMIN_PASSWORD, TEST_ADMIN_USERNAME

from .conftest import SHARDS, BrowserErrors, Stack
from .tokens import read_only_token

pytestmark = [pytest.mark.slow, pytest.mark.redis]

Page = Any  # playwright.sync_api.Page; kept loose so mypy needs no stubs here


def sign_in(page: Page, stack: Stack, password: str = TEST_ADMIN_PASSWORD) -> None:
    """Sign in with the keyboard only, as an operator would."""
    page.goto(stack.console_url)
    page.get_by_label("Username").fill(TEST_ADMIN_USERNAME)
    page.get_by_label("Password").fill(password)
    page.get_by_label("Password").press("Enter")


def open_group(page: Page, stack: Stack) -> None:
    page.get_by_role("link", name=stack.group).click()
    expect(page.locator("#group-title")).to_have_text(f"{stack.prefix} / {stack.group}")


def owners(page: Page) -> dict[int, str]:
    cards = page.locator("#shard-grid [data-shard]")
    return {
        int(card.get_attribute("data-shard")): card.get_attribute("data-owner")
        for card in cards.all()
    }


def test_wrong_password_shows_the_error(
    page: Page, stack: Stack, browser_errors: BrowserErrors
) -> None:
    sign_in(page, stack, password="not-the-password")
    error = page.locator("#signin-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("invalid username or password")
    expect(page.locator("#overview-view")).to_be_hidden()
    browser_errors.allow_http(401)


def test_sign_in_shows_every_shard_owned(page: Page, stack: Stack, screenshots: Path) -> None:
    sign_in(page, stack)
    row = page.locator(f'#groups-table tr[data-group="{stack.prefix}/{stack.group}"]')
    expect(row).to_contain_text(f"{SHARDS} / {SHARDS}")
    expect(page.locator("#health")).to_have_attribute("data-status", "UP")
    expect(page.locator("#who")).to_contain_text("READ, WRITE")
    # Rates need two polls; wait for them so the screenshot shows numbers.
    expect(row.locator("td").nth(7)).to_have_text(re.compile(r"^\d"))
    page.screenshot(path=str(screenshots / "console-overview.png"))

    open_group(page, stack)
    assigned = page.locator('#shard-grid [data-state="assigned"]')
    expect(assigned).to_have_count(SHARDS)
    # Both consumers join; the grid settles on two shards each.
    for base in ("consumer-a", "consumer-b"):
        mine = page.locator(f'#shard-grid [data-owner^="{base}-"][data-state="assigned"]')
        expect(mine).to_have_count(SHARDS // 2)
    members = page.locator("#members-table tbody tr")
    expect(members).to_have_count(2)
    expect(members.first).to_contain_text("ACTIVE")
    page.screenshot(path=str(screenshots / "console-shards.png"), full_page=True)

    # Messages: newest page first, then the oldest, then forward and back.
    where = page.locator("#msg-where")
    expect(where).to_contain_text(f"{stack.prefix}:0: 20 entries")
    rows = page.locator("#messages-table tbody tr")
    expect(rows.last).to_contain_text("orderId=o-0-29")
    page.get_by_role("button", name="First", exact=True).click()
    expect(rows.first).to_contain_text("orderId=o-0-0")
    expect(page.get_by_role("button", name="Prev", exact=True)).to_be_disabled()
    page.get_by_role("button", name="Next", exact=True).click()
    expect(where).to_contain_text("10 entries")
    expect(rows.last).to_contain_text("orderId=o-0-29")
    page.get_by_role("button", name="Prev", exact=True).click()
    expect(rows.first).to_contain_text("orderId=o-0-0")

    # A narrow window: everything still fits (tables scroll in their own box).
    page.set_viewport_size({"width": 400, "height": 800})
    expect(page.locator("#shard-grid [data-shard]")).to_have_count(SHARDS)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px at 400px"


def test_read_only_user_cannot_scale(
    page: Page, stack: Stack, browser_errors: BrowserErrors
) -> None:
    page.goto(stack.console_url)
    # No READ-only principal exists yet: the token stands in for its login.
    page.evaluate(
        "t => sessionStorage.setItem('streamkit.console.token', t)", read_only_token("viewer")
    )
    page.reload()
    expect(page.locator("#who")).to_have_text("viewer (READ)")
    open_group(page, stack)
    expect(page.locator('#shard-grid [data-state="assigned"]')).to_have_count(SHARDS)
    expect(page.get_by_role("button", name="Scale…")).to_be_disabled()
    expect(page.locator("#scale-target")).to_be_disabled()
    expect(page.locator("#scale-note")).to_contain_text("read access only")
    # A group that does not exist: the API's answer is shown, nothing breaks.
    page.goto(f"{stack.console_url}#/group/{stack.prefix}/nobody")
    expect(page.locator("#poll-error")).to_contain_text("GROUP_NOT_FOUND")
    browser_errors.allow_http(404)
    page.get_by_role("link", name="Streams").click()
    expect(page.locator("#poll-error")).to_be_hidden()
    # Signing out forgets the token: a reload asks for credentials again.
    page.get_by_role("button", name="Sign out").click()
    page.reload()
    expect(page.locator("#signin-view")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0


def fill_change(page: Page, target: int, reason: str) -> None:
    page.get_by_label("Requested by").fill("console test")
    page.get_by_label("Reason").fill(reason)
    page.get_by_label("Target shards").fill(str(target))
    page.get_by_role("button", name="Scale…").click()


def test_scale_4_to_6_reaches_deprecated(
    page: Page, stack: Stack, browser_errors: BrowserErrors, screenshots: Path
) -> None:
    sign_in(page, stack)
    open_group(page, stack)
    expect(page.locator('#shard-grid [data-state="assigned"]')).to_have_count(SHARDS)

    # Cancel first: nothing happens.
    fill_change(page, 6, "more partitions")
    dialog = page.locator("#confirm")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"from {SHARDS} to 6 shards")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(page.locator("#group-shard-count")).to_have_text(str(SHARDS))

    fill_change(page, 6, "more partitions")
    page.get_by_role("button", name="Scale to 6").click()
    state = page.locator("#migration-state")
    expect(state).to_have_text(re.compile("ACTIVE|DRAINING"))
    expect(page.locator("#group-shard-count")).to_have_text("6")
    expect(page.locator('#migration .steps li[aria-current="step"]')).to_have_text(
        re.compile("ACTIVE|DRAINING")
    )
    page.locator("#resharding-heading").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "console-migration.png"))

    expect(state).to_have_text("DEPRECATED", timeout=30_000)
    expect(page.locator('#shard-grid [data-state="assigned"]')).to_have_count(6)
    history = page.locator("#history-table tbody tr")
    expect(history.first).to_contain_text("4 → 6")
    expect(history.first).to_contain_text("DEPRECATED")
    expect(history.first).to_contain_text("more partitions")

    # A refused change shows the API's own message.
    fill_change(page, 6, "again")
    page.get_by_role("button", name="Scale to 6").click()
    expect(page.locator("#action-error")).to_contain_text("SHARD_COUNT_UNCHANGED")
    browser_errors.allow_http(422)


def test_rollback_returns_to_the_previous_layout(page: Page, stack: Stack) -> None:
    sign_in(page, stack)
    open_group(page, stack)
    expect(page.locator("#group-shard-count")).to_have_text("6")
    fill_change(page, 8, "try 8")
    page.get_by_role("button", name="Scale to 8").click()
    expect(page.locator("#migration-state")).to_have_text(re.compile("ACTIVE|DRAINING"))
    rollback = page.get_by_role("button", name="Roll back…")
    expect(rollback).to_be_enabled()
    rollback.click()
    page.get_by_role("button", name="Roll back", exact=True).click()
    expect(page.locator("#migration-state")).to_have_text("ROLLED_BACK", timeout=30_000)
    expect(page.locator("#group-shard-count")).to_have_text("6")
    expect(page.locator("#shard-grid [data-shard]")).to_have_count(6)
    expect(rollback).to_be_hidden()


def test_killed_consumer_loses_its_shards(page: Page, stack: Stack) -> None:
    sign_in(page, stack)
    open_group(page, stack)
    cards = page.locator('#shard-grid [data-state="assigned"]')
    expect(cards).to_have_count(6)
    before = owners(page)
    assert any(o.startswith("consumer-a-") for o in before.values()), before

    stack.consumers["consumer-a"].kill()
    # After the member lease (1.5 s) every shard belongs to consumer-b.
    expect(
        page.locator('#shard-grid [data-owner^="consumer-b-"][data-state="assigned"]')
    ).to_have_count(6, timeout=20_000)
    expect(page.locator("#members-table tbody")).to_contain_text("EXPIRED")
