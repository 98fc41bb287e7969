"""Shared fixtures: real, private Redis servers (never fakes or mocks).

The session fixtures are lazy: a run that never asks for the cluster never
pays for starting it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from core.coverage import REPORT
from hypothesis import settings
from reference_contract import MISSING_REASON

from streamkit.testing import HOST, RedisCluster, RedisServer, RedisTarget

# No per-example deadline: it is a timing assertion, and a loaded CI machine
# (xdist workers beside real Redis servers) trips it on correct code.
settings.register_profile("streamkit", deadline=None)
settings.load_profile("streamkit")

_STANDALONE_FIXTURES = frozenset({"redis_server", "redis_url", "private_redis_server"})
_CLUSTER_FIXTURES = frozenset({"redis_cluster", "cluster_url"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Derive the `redis` / `cluster` markers from the fixtures a test uses, so
    # `-m "not cluster"` works without every test having to repeat itself.
    # tryfirst: the markers must exist before pytest's own -m deselection.
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        uses_cluster = bool(names & _CLUSTER_FIXTURES) or params.get("any_redis") == "cluster"
        if uses_cluster or names & _STANDALONE_FIXTURES or "any_redis" in names:
            item.add_marker(pytest.mark.redis)
        if uses_cluster:
            item.add_marker(pytest.mark.cluster)


# -- the simulation's coverage lines, also when tests run in xdist workers -------


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the lines to the controller
        workeroutput["simulation_report"] = list(REPORT)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    REPORT.extend(getattr(node, "workeroutput", {}).get("simulation_report", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in REPORT:
        terminalreporter.write_line(line)
    # Visible without -rs: a clone without ../shared skips the contract checks.
    skipped = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if MISSING_REASON in str(getattr(report, "longrepr", ""))
    ]
    if skipped:
        terminalreporter.write_line(
            f"note: {len(skipped)} contract tests skipped: {MISSING_REASON}", yellow=True
        )


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One standalone redis-server for the whole session."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """One 3-primary Redis Cluster (no replicas) for the whole session."""
    with RedisCluster(primaries=3) as cluster:
        yield cluster


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session's standalone server, flushed for this test."""
    redis_server.flushall()
    return redis_server.url


@pytest.fixture
def cluster_url(redis_cluster: RedisCluster) -> str:
    """URL of a node of the session's cluster, every primary flushed for this test."""
    redis_cluster.flushall()
    return redis_cluster.url


@pytest.fixture(params=["standalone", "cluster"])
def any_redis(request: pytest.FixtureRequest) -> RedisTarget:
    """Run the test once against standalone Redis and once against the cluster."""
    if request.param == "cluster":
        # getfixturevalue keeps the cluster lazy: only started if selected.
        return RedisTarget(url=request.getfixturevalue("cluster_url"), cluster=True)
    return RedisTarget(url=request.getfixturevalue("redis_url"), cluster=False)


@pytest.fixture
def private_redis_server() -> Iterator[RedisServer]:
    """A standalone server owned by one test, free to be killed and restarted."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def primary_and_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A private primary and an asynchronous replica of it, for failover tests."""
    with RedisServer() as primary:
        with RedisServer(extra_args=("--replicaof", HOST, str(primary.port))) as replica:
            yield primary, replica


from coordinator_fixtures import coordinator, coordinator_factory, coordinator_pool  # noqa: E402, F401
