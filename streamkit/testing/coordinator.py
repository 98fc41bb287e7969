"""Run a real coordinator (``python -m streamkit_server``) as a subprocess.

Used by the server tests, the client tests and ``streamkit demo``: the
coordinator is started exactly as in production, on a free loopback port,
talking to the given Redis (how it is started and torn down:
``streamkit.testing.process``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import httpx

from streamkit.testing.process import HOST, ManagedProcess, PortTakenError, free_port

__all__ = [
    "TEST_ADMIN_PASSWORD",
    "TEST_ADMIN_USERNAME",
    "TEST_TOKEN_SECRET",
    "CoordinatorProcess",
    "CoordinatorProcessError",
]

#: The credentials every launched coordinator gets unless told otherwise.  The
#: member API needs them too (it is authenticated by default), so simulated
#: members send them.
TEST_ADMIN_USERNAME = "admin"
TEST_ADMIN_PASSWORD = "streamkit-test-password"
TEST_TOKEN_SECRET = "streamkit-test-token-secret"

_STARTUP_ATTEMPTS = 3


class CoordinatorProcessError(RuntimeError):
    """The coordinator process could not be started or did not become healthy.

    Not ``streamkit.CoordinatorError`` (a coordinator's error answer): this is
    the test launcher failing to run one.
    """


class _PortTakenError(CoordinatorProcessError, PortTakenError):
    pass


def __getattr__(name: str) -> Any:
    if name == "CoordinatorError":
        warnings.warn(
            "streamkit.testing.coordinator.CoordinatorError is now CoordinatorProcessError",
            DeprecationWarning,
            stacklevel=2,
        )
        return CoordinatorProcessError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CoordinatorProcess(ManagedProcess):
    """One coordinator process; ``start()`` blocks until it answers ``/healthz``.

    Timings default to short, test-friendly values; pass ``None`` to use the
    server's own defaults.  ``env`` adds or overrides ``STREAMKIT_SERVER_*``.
    The member API stays authenticated, as in production: members use
    ``member_auth`` (the admin holds the MEMBER role).  ``python`` runs the
    server with another interpreter (another release's virtualenv, with
    ``cwd`` and ``PYTHONPATH`` in ``env`` pointing at its code).
    """

    def __init__(
        self,
        redis_url: str,
        *,
        cluster: bool = False,
        admin_username: str = TEST_ADMIN_USERNAME,
        admin_password: str = TEST_ADMIN_PASSWORD,
        token_secret: str | None = TEST_TOKEN_SECRET,
        heartbeat_interval_ms: int | None = 200,
        member_lease_ttl_ms: int | None = 1_500,
        rebalance_timeout_ms: int | None = 3_000,
        tick_interval_ms: int | None = 100,
        shutdown_grace_ms: int | None = 0,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        startup_timeout: float = 30.0,
        python: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="streamkit-coordinator-"))
        super().__init__(self._dir / "coordinator.log")
        self.redis_url = redis_url
        self.cluster = cluster
        self.admin_username = admin_username
        self.admin_password = admin_password
        self._fixed_port = port is not None
        self._port = port if port is not None else free_port()
        self._startup_timeout = startup_timeout
        self._python = os.fspath(python) if python is not None else sys.executable
        self._cwd = os.fspath(cwd) if cwd is not None else None
        settings: dict[str, str | int | None] = {
            "REDIS_URL": redis_url,
            "REDIS_CLUSTER": "true" if cluster else "false",
            "ADMIN_USERNAME": admin_username,
            "ADMIN_PASSWORD": admin_password,
            "TOKEN_SECRET": token_secret,
            "HEARTBEAT_INTERVAL_MS": heartbeat_interval_ms,
            "MEMBER_LEASE_TTL_MS": member_lease_ttl_ms,
            "REBALANCE_TIMEOUT_MS": rebalance_timeout_ms,
            "TICK_INTERVAL_MS": tick_interval_ms,
            "SHUTDOWN_GRACE_MS": shutdown_grace_ms,
            "HOST": HOST,
        }
        self._env = {f"STREAMKIT_SERVER_{k}": str(v) for k, v in settings.items() if v is not None}
        self._env.update(env or {})
        #: The running process' id in the coordinator registry (from ``/healthz``).
        self.coordinator_id: str | None = None
        # Every launch's registry id: its entry outlives it (see forget_registrations).
        self._launched: list[str] = []

    # -- properties ----------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    @property
    def admin_auth(self) -> tuple[str, str]:
        """``(username, password)``, ready for ``httpx``'s ``auth=``."""
        return (self.admin_username, self.admin_password)

    @property
    def member_auth(self) -> tuple[str, str]:
        """Credentials with the MEMBER role, for heartbeats."""
        return self.admin_auth

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> Self:
        if self.is_running():
            raise CoordinatorProcessError(f"coordinator on port {self._port} is already running")
        self._register()
        self._start_with_port_retries(
            _STARTUP_ATTEMPTS, self._launch_and_wait, None if self._fixed_port else self._new_port
        )
        return self

    def _new_port(self) -> None:
        self._port = free_port()

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait (graceful shutdown); returns the exit status."""
        code = self._terminate(signal.SIGTERM, timeout)
        self._unregister()
        return code

    def kill(self) -> int | None:
        """SIGKILL, to simulate a crash (no shutdown sequence runs)."""
        return self._terminate(signal.SIGKILL, 10.0)

    def restart(self) -> Self:
        """Stop (gracefully) if running, then start again on the same port."""
        self.stop()
        self._fixed_port = True
        return self.start()

    def signal(self, sig: int) -> None:
        """Send ``sig`` without waiting (e.g. SIGTERM while requests are in flight)."""
        self._signal(sig)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; returns its status."""
        if self._proc is None:
            raise CoordinatorProcessError("coordinator was never started")
        return self._proc.wait(timeout)

    def close(self) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Stop, forget this object's registry entries, delete the log directory."""
        self.stop()
        self.forget_registrations()
        with contextlib.suppress(OSError):
            for path in self._dir.iterdir():
                path.unlink()
            self._dir.rmdir()

    # -- helpers ---------------------------------------------------------------

    def forget_registrations(self) -> None:
        """Remove the timing-registry entries of this object's stopped launches.

        A coordinator's entry outlives it, binding the Redis to its timings
        until the leases it granted have run out (30 s after a crash, its
        routing lease after a stop): no coordinator with other timings may
        start there meanwhile.  A test that is done with a coordinator, whose
        members are gone, lets the next test on a shared server use other
        timings at once.  Best effort: the server may be gone already.
        """
        ended = [i for i in self._launched if i != self.coordinator_id or not self.is_running()]
        if not ended:
            return
        import redis
        from redis.cluster import RedisCluster

        # A leaf of the server (standard library only): the client package
        # does not need the server to name the key its coordinators share.
        from streamkit_server.store.keys import DEFAULT_KEY_PREFIX, coordinators_key

        prefix = self._env.get("STREAMKIT_SERVER_KEY_PREFIX", DEFAULT_KEY_PREFIX)
        client = (RedisCluster if self.cluster else redis.Redis).from_url(self.redis_url)
        with contextlib.suppress(redis.RedisError, OSError):
            client.hdel(coordinators_key(prefix), *ended)
        client.close()
        self._launched = [i for i in self._launched if i not in ended]

    def _launch_and_wait(self) -> None:
        env = dict(os.environ)
        env.update(self._env)
        env["STREAMKIT_SERVER_PORT"] = str(self._port)
        env["PYTHONUNBUFFERED"] = "1"
        proc = self._spawn([self._python, "-m", "streamkit_server"], env=env, cwd=self._cwd)
        deadline = time.monotonic() + self._startup_timeout
        with httpx.Client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                code = proc.poll()
                if code is not None:
                    self._proc = None
                    logs = self.logs()
                    if "address already in use" in logs.lower():
                        raise _PortTakenError(f"port {self._port} taken:\n{logs}")
                    raise CoordinatorProcessError(
                        f"coordinator exited with status {code} during start-up:\n{logs}"
                    )
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    reply = client.get(f"{self.url}/healthz")
                    # Only our own process counts: another coordinator may be
                    # listening on the port if ours failed to bind it.
                    health = reply.json()
                    if reply.status_code == 200 and health.get("pid") == proc.pid:
                        self.coordinator_id = health.get("coordinatorId")
                        if self.coordinator_id is not None:
                            self._launched.append(self.coordinator_id)
                        return
                time.sleep(0.05)
        self._terminate(signal.SIGKILL, 5.0)
        raise CoordinatorProcessError(
            f"coordinator did not become healthy within {self._startup_timeout:.0f}s:\n"
            f"{self.logs()}"
        )
