"""Fixtures that run real coordinator processes (``python -m streamkit_server``).

* ``coordinator``: one process per Redis flavour (standalone / cluster),
  shared by the tests of a module; pairs with ``any_redis``.  Tests that kill
  or reconfigure a coordinator use ``coordinator_factory`` instead.
* ``coordinator_factory``: start extra processes; all are stopped at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess

CoordinatorFactory = Callable[..., CoordinatorProcess]


class CoordinatorPool:
    """Coordinators shared within a module, keyed by the Redis they talk to."""

    def __init__(self) -> None:
        self._procs: dict[tuple[str, bool], CoordinatorProcess] = {}

    def get(self, target: RedisTarget, **options: Any) -> CoordinatorProcess:
        key = (target.url, target.cluster)
        proc = self._procs.get(key)
        if proc is None:
            proc = self._procs[key] = CoordinatorProcess(
                target.url, cluster=target.cluster, **options
            )
        if not proc.is_running():
            proc.start()
        return proc

    def close(self) -> None:
        for proc in self._procs.values():
            proc.cleanup()
        self._procs.clear()


@pytest.fixture(scope="module")
def coordinator_pool() -> Iterator[CoordinatorPool]:
    pool = CoordinatorPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def coordinator(any_redis: RedisTarget, coordinator_pool: CoordinatorPool) -> CoordinatorProcess:
    """A running coordinator on ``any_redis`` (flushed per test; the process is reused)."""
    return coordinator_pool.get(any_redis)


@pytest.fixture
def coordinator_factory() -> Iterator[CoordinatorFactory]:
    started: list[CoordinatorProcess] = []

    def make(target: RedisTarget, *, start: bool = True, **options: Any) -> CoordinatorProcess:
        proc = CoordinatorProcess(target.url, cluster=target.cluster, **options)
        started.append(proc)
        if start:
            proc.start()
        return proc

    try:
        yield make
    finally:
        for proc in started:
            proc.cleanup()
