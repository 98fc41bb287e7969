"""The pytest plugin (``streamkit.testing.plugin``, loaded by its ``pytest11`` entry point):
an app runs in the test's event loop on the session's real redis-server and coordinator,
``drain()`` waits for every entry, dead letters can be read."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import anyio
import pytest

from streamkit import Message
from streamkit.consumer.failure import FailurePolicy
from streamkit.consumer.lifecycle import monotonic_ms
from streamkit.routing import shard_for_key
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


async def test_the_docs_kill_example_passes(streamkit_harness: StreamKitHarness) -> None:
    (source,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOC), "exec"), namespace)
    await namespace["test_a_killed_member_loses_nothing"](streamkit_harness)


@pytest.mark.streamkit(shards=2)
async def test_kill_and_restart_move_shards_and_redeliver_unacked(
    streamkit_harness: StreamKitHarness,
) -> None:
    harness = streamkit_harness
    app = harness.app()
    held: list[tuple[str, str]] = []  # (member, n) of entries the killed member never acked
    done: list[tuple[str, str]] = []
    victim: list[str] = []

    @app.stream_listener(stream_prefix=harness.stream_prefix, group=harness.group, concurrency=2)
    async def handle(msg: Message) -> None:
        if msg.member_id in victim:
            held.append((msg.member_id, msg.fields["n"]))
            await anyio.sleep_forever()  # cancelled by the kill, never acked
        done.append((msg.member_id, msg.fields["n"]))
        await msg.ack()

    async with harness.running(app):
        first, second = app.members
        if not first.machine.readable(monotonic_ms()):
            # Settled means every shard is owned, not that both members own
            # one yet (the later one may still wait for its revoke-before-assign).
            first, second = second, first
        victim.append(first.member_id)
        owned = first.machine.readable(monotonic_ms())
        shard = min(owned)
        # A key of the victim's shard: its entry stays unacked when the member dies.
        key = next(k for k in (f"k{i}" for i in range(100)) if shard_for_key(k, 2) == shard)
        await harness.publish(key, {"n": "held"})
        with anyio.fail_after(5):
            while not held:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        killed = harness.kill_member(app, app.members.index(first))
        assert killed is first and killed.crashed
        await harness.settled(app)
        await harness.drain()
        # The survivor got the dead member's shard and the entry it never acked.
        assert "held" in {n for m, n in done if m == second.member_id}
        fresh = harness.restart_member(app, killed)
        assert fresh.member_id != killed.member_id and fresh in app.members
        with anyio.fail_after(10):
            # Revoke-before-assign: the survivor gives a shard back to the new member.
            while not fresh.machine.readable(monotonic_ms()):  # noqa: ASYNC110
                await anyio.sleep(0.01)
        await harness.settled(app)
        await harness.publish(key, {"n": "after"})
        await harness.drain()
    assert [n for _, n in done].count("held") == 1
    assert "after" in [n for _, n in done]


def _config_blocks() -> dict[str, str]:
    text = DOC.read_text()
    return {lang: re.findall(rf"```{lang}\n(.*?)```", text, re.S)[0] for lang in ("toml", "ini")}


@pytest.mark.redis  # the fresh project's session starts its own redis-server
def _pytest_passes(project: Path, tests: int) -> None:
    """pytest in ``project`` as its developer runs it (no ``STREAMKIT_``/``PYTEST_``
    variables of ours), warnings as errors: ``tests`` tests pass."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMKIT_", "PYTEST_"))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{tests} passed" in result.stdout, result.stdout


def test_the_docs_project_runs_as_written(tmp_path: Path) -> None:
    """A new project holding only the guide's config block and its test file
    passes: the page starts with everything pytest needs."""
    (tests,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    (tmp_path / "pyproject.toml").write_text(_config_blocks()["toml"])
    (tmp_path / "test_orders.py").write_text(tests)
    _pytest_passes(tmp_path, 2)


def test_the_docs_pytest_ini_says_the_same() -> None:
    """The ``pytest.ini`` alternative sets what the ``pyproject`` block sets."""
    blocks = _config_blocks()
    toml = tomllib.loads(blocks["toml"])["tool"]["pytest"]["ini_options"]
    ini = configparser.ConfigParser()
    ini.read_string(blocks["ini"])
    assert dict(ini["pytest"]) == {k: str(v) for k, v in toml.items()}


async def test_send_waits_for_the_ack_or_the_dead_letter_with_ms_backoff(
    streamkit_harness: StreamKitHarness,
) -> None:
    harness = streamkit_harness
    app = harness.app()  # TEST_SETTINGS: retries after 1..20 ms, 5 attempts
    attempts: list[int] = []

    async def handle(payload: dict[str, int], msg: Message) -> None:
        attempts.append(msg.attempt)
        if payload["n"] < 0:
            raise ValueError("negative")
        await msg.ack()  # it takes the Message: it acks

    harness.listen(app, handle)
    async with harness.running(app):
        ok = await harness.send("k", {"payload": '{"n": 1}'}, within=30)
        bad = await harness.send("k", {"payload": '{"n": -1}'}, within=30)
    assert not ok.dead_lettered and ok.error is None
    assert bad.dead_lettered and bad.error == "ValueError: negative"
    assert bad.dead_letter is not None and bad.dead_letter["x-original-id"] == bad.result.record_id
    assert attempts == [1, 1, 2, 3, 4, 5]


@pytest.mark.long  # about 20-40 s on a shared 2-core machine: python bench/app_tests.py
def test_the_example_suite_passes_without_warnings() -> None:
    suite = Path(__file__).resolve().parents[1] / "samples" / "app_tests"
    _pytest_passes(suite, 20)
