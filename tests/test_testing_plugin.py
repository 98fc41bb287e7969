"""The pytest plugin (``streamkit.testing.plugin``, loaded by its ``pytest11`` entry point):
an app runs in the test's event loop on the session's real redis-server and coordinator,
``drain()`` waits for every entry, dead letters can be read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from streamkit import Message
from streamkit.consumer.failure import FailurePolicy
from streamkit.testing.harness import StreamKitHarness

DOC = Path(__file__).resolve().parents[1] / "docs" / "testing-apps.md"


@pytest.mark.streamkit(shards=3, group="billing")
async def test_harness_runs_an_app_and_drains(streamkit_harness: StreamKitHarness) -> None:
    harness = streamkit_harness
    app = harness.app()
    handled: list[str] = []

    @app.stream_listener(
        stream_prefix=harness.stream_prefix,
        group=harness.group,
        failure_policy=FailurePolicy(max_attempts=2, backoff_initial_ms=5),
    )
    async def handle(msg: Message) -> None:
        if msg.fields["n"] == "bad":
            raise ValueError("cannot")
        handled.append(msg.fields["n"])
        await msg.ack()

    async with harness.running(app):
        for n in ["1", "2", "bad", "3"]:
            await harness.publish(f"k{n}", {"n": n})
        await harness.drain()
    assert sorted(handled) == ["1", "2", "3"]
    (letter,) = await harness.dead_letters()
    assert letter["n"] == "bad" and letter["x-error"] == "ValueError: cannot"
    assert harness.shards == 3 and harness.group == "billing"


async def test_each_test_gets_its_own_group(streamkit_harness: StreamKitHarness) -> None:
    # The session's servers are shared: another group is one HTTP call on them.
    other = StreamKitHarness(streamkit_harness.coordinator, streamkit_harness.redis_url)
    await other.create_group()
    await other.create_group()  # idempotent
    assert other.stream_prefix != streamkit_harness.stream_prefix
    await other.aclose()


def test_plugin_is_registered(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.has_plugin("streamkit")


async def test_the_docs_example_passes(streamkit_harness: StreamKitHarness) -> None:
    (source,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOC), "exec"), namespace)
    await namespace["test_negative_amounts_are_dead_lettered"](streamkit_harness)
