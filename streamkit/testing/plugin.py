"""The streamkit pytest plugin (entry point ``pytest11``), loaded when streamkit is installed.

Fixtures, all on real parts (no fakes):

* ``streamkit_redis``: one embedded ``redis-server`` per session (needs
  ``redis-server`` on PATH);
* ``streamkit_coordinator``: one coordinator process on it per session;
* ``streamkit_harness``: per test, a fresh stream prefix and group (2 shards;
  ``@pytest.mark.streamkit(shards=N, group="name")`` to change) and a
  :class:`~streamkit.testing.harness.StreamKitHarness` to run apps in the
  test's event loop, publish, ``await harness.send(key, fields)`` (publish and
  wait until handled or dead-lettered), ``await harness.drain()`` and read
  dead letters.  Its apps retry failed handlers after milliseconds.

Under pytest-xdist every worker is a session of its own: one redis-server and
one coordinator per worker.  When the project leaves pytest-asyncio's
``asyncio_default_fixture_loop_scope`` unset, the plugin sets it to
``function`` (pytest-asyncio's future default), so no deprecation warning is
printed; a project's own setting always wins.

Every name starts with ``streamkit_`` so the plugin never shadows a
project's own ``redis``/``coordinator`` fixtures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from streamkit.testing.coordinator import CoordinatorProcess
from streamkit.testing.harness import StreamKitHarness
from streamkit.testing.redis_server import RedisServer

__all__ = ["streamkit_coordinator", "streamkit_harness", "streamkit_redis"]


@pytest.hookimpl(tryfirst=True)  # before pytest-asyncio reads (and warns about) it
def pytest_configure(config: pytest.Config) -> None:
    _default_ini(config, "asyncio_default_fixture_loop_scope", "function")
    config.addinivalue_line(
        "markers", "streamkit(shards=2, group='app'): the streamkit_harness group's shape"
    )


def _default_ini(config: pytest.Config, name: str, value: str) -> None:
    try:
        current = config.getini(name)
    except ValueError:  # pytest-asyncio is not installed: nothing to set
        return
    if not current and isinstance(getattr(config, "_inicache", None), dict):
        # pytest has no public setter for an ini value; getini reads this cache.
        config._inicache[name] = value


@pytest.fixture(scope="session")
def streamkit_redis() -> Iterator[RedisServer]:
    """An embedded redis-server for the whole session."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def streamkit_coordinator(streamkit_redis: RedisServer) -> Iterator[CoordinatorProcess]:
    """A coordinator process on ``streamkit_redis`` for the whole session."""
    with CoordinatorProcess(streamkit_redis.url) as coordinator:
        yield coordinator


@pytest_asyncio.fixture
async def streamkit_harness(
    request: pytest.FixtureRequest,
    streamkit_redis: RedisServer,
    streamkit_coordinator: CoordinatorProcess,
) -> AsyncIterator[StreamKitHarness]:
    """This test's own stream prefix and group, created on the session's coordinator."""
    marker = request.node.get_closest_marker("streamkit")
    options = dict(marker.kwargs) if marker is not None else {}
    harness = StreamKitHarness(
        streamkit_coordinator,
        streamkit_redis.url,
        shards=int(options.get("shards", 2)),
        group=str(options.get("group", "app")),
    )
    await harness.create_group()
    try:
        yield harness
    finally:
        await harness.aclose()
