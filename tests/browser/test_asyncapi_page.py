"""``streamkit docs --serve``: the AsyncAPI page of the orders sample in Debian's
Chromium, with its streams and payload fields visible (screenshot for the docs)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def served() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamkit", "docs", "samples.orders.app:app",
         "--serve", "--port", "0", "--title", "Orders sample"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "serving the AsyncAPI page at http://...:PORT/ ..."
        assert "serving the AsyncAPI page at" in line, line + (proc.stderr.read() or "")
        yield line.split(" at ", 1)[1].split()[0]
    finally:
        proc.terminate()  # by its own pid
        proc.wait(10)


def test_the_page_renders_streams_and_payloads(
    served: str, page: object, screenshots: Path
) -> None:
    document = httpx.get(f"{served}asyncapi.json", timeout=10).json()
    assert document["asyncapi"] == "3.0.0"
    page.goto(served)  # type: ignore[attr-defined]
    body = page.locator("body")  # type: ignore[attr-defined]
    text = body.inner_text()
    assert "Orders sample" in text
    assert "Stream orders" in text and "orders:{shard}" in text and "8" in text
    assert "receive" in text and "billing" in text and "send" in text
    assert "order_id" in text and "amount" in text  # the Order payload's fields
    page.locator("#channel-orders").screenshot(path=str(screenshots / "asyncapi-page.png"))  # type: ignore[attr-defined]
