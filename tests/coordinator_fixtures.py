"""Fixtures that run real coordinator processes (``python -m streamkit_server``).

* ``coordinator``: one process per Redis flavour (standalone / cluster),
  shared by the tests of a module; pairs with ``any_redis``.  Tests that kill
  or reconfigure a coordinator use ``coordinator_factory`` instead.
* ``coordinator_factory``: start extra processes; all are stopped at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Self

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

    def stop(self, target: RedisTarget) -> None:
        """Stop the shared process on ``target``, if any (``get`` starts it again)."""
        proc = self._procs.get((target.url, target.cluster))
        if proc is not None and proc.is_running():
            proc.stop()
            proc.forget_registrations()  # its members are gone: other timings may start

    def close(self) -> None:
        for proc in self._procs.values():
            proc.cleanup()
        self._procs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@pytest.fixture(scope="module")
def coordinator_pool() -> Iterator[CoordinatorPool]:
    with CoordinatorPool() as pool:
        yield pool


@pytest.fixture
def coordinator(any_redis: RedisTarget, coordinator_pool: CoordinatorPool) -> CoordinatorProcess:
    """A running coordinator on ``any_redis`` (flushed per test; the process is reused)."""
    return coordinator_pool.get(any_redis)


# Settings every coordinator on one Redis must share (streamkit_server.coordination.timings).
_TIMINGS = ("HEARTBEAT_INTERVAL_MS", "MEMBER_LEASE_TTL_MS", "REBALANCE_TIMEOUT_MS",
            "PRODUCER_ROUTING_LEASE_MS")  # fmt: skip


def _sets_timings(options: dict[str, Any]) -> bool:
    names = {name.upper() for name in options} | {
        name.removeprefix("STREAMKIT_SERVER_") for name in options.get("env") or {}
    }
    return any(name.endswith(timing) for name in names for timing in _TIMINGS)


@pytest.fixture
def coordinator_factory(coordinator_pool: CoordinatorPool) -> Iterator[CoordinatorFactory]:
    started: list[CoordinatorProcess] = []

    def make(target: RedisTarget, *, start: bool = True, **options: Any) -> CoordinatorProcess:
        if _sets_timings(options):
            # A coordinator with other timings is refused while another one
            # runs on the same Redis: the module's shared one steps aside
            # (the `coordinator` fixture starts it again when a test asks).
            coordinator_pool.stop(target)
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
