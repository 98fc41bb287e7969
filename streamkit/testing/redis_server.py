"""Launch private ``redis-server`` processes on free loopback ports.

This powers the real-Redis test fixtures and the embedded Redis of
``streamkit demo``. Every process gets its own temporary directory and no
persistence; how it is started, watched and torn down (by PID, never by name)
is :class:`~streamkit.testing.process.ManagedProcess`'s. A Redis Cluster of
such servers: ``streamkit.testing.redis_cluster``.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from streamkit.testing.process import (
    CLUSTER_BUS_PORT_OFFSET,
    HOST,
    ManagedProcess,
    PortTakenError,
    free_port,
    tail,
)

__all__ = [
    "CLUSTER_BUS_PORT_OFFSET",
    "HOST",
    "RedisNotInstalledError",
    "RedisServer",
    "RedisServerError",
    "free_port",
    "which",
]

INSTALL_HINT = "install it with: apt-get update && apt-get install -y redis-server"
# A few retries cover the unavoidable race between free_port() releasing its
# probe socket and redis-server binding the port.
_BIND_RETRIES = 5


class RedisServerError(RuntimeError):
    """A private redis-server could not be started, reached or configured."""


class RedisNotInstalledError(RedisServerError):
    """``redis-server`` or ``redis-cli`` is not on PATH."""


class _PortTakenError(RedisServerError, PortTakenError):
    def __init__(self, port: int, logs: str) -> None:
        super().__init__(
            f"port {port} (or its cluster bus port) is already in use; log tail:\n{logs}"
        )


def which(name: str, explicit: str | None) -> str:
    """The path of Redis' ``name`` executable (``explicit`` if given), or
    ``RedisNotInstalledError`` saying how to install it."""
    if explicit is not None:
        if not os.access(explicit, os.X_OK):
            raise RedisNotInstalledError(f"{explicit!r} is not an executable; {INSTALL_HINT}")
        return explicit
    found = shutil.which(name)
    if found is None:
        raise RedisNotInstalledError(f"{name!r} was not found on PATH; {INSTALL_HINT}")
    return found


class RedisServer(ManagedProcess):
    """One private ``redis-server`` bound to 127.0.0.1 with no persistence.

    Construction does not start anything; call :meth:`start` or use it as a
    context manager. The port is fixed for the object's lifetime once the
    server has started, so :meth:`restart` comes back on the same URL.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        cluster_enabled: bool = False,
        cluster_node_timeout_ms: int = 5000,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 15.0,
        stop_timeout: float = 10.0,
        executable: str | None = None,
        die_with_parent: bool = True,
    ) -> None:
        super().__init__()
        self._executable = which("redis-server", executable)
        self._fixed_port = port is not None
        self._cluster_enabled = cluster_enabled
        self._port = port if port is not None else free_port(cluster_bus=cluster_enabled)
        self._cluster_node_timeout_ms = cluster_node_timeout_ms
        self._extra_args = tuple(extra_args)
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._die_with_parent = die_with_parent
        self._dir: Path | None = None
        # redis.log is appended to across restarts; diagnostics only look at
        # what the current launch wrote.
        self._redis_log_offset = 0

    # -- properties -------------------------------------------------------

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self._port}/0"

    @property
    def dir(self) -> Path | None:
        """The server's working directory (``None`` before start / after stop)."""
        return self._dir

    @property
    def log_path(self) -> Path | None:
        return self._dir / "redis.log" if self._dir is not None else None

    # -- lifecycle --------------------------------------------------------

    def start(self) -> Self:
        """Start the server and block until it answers PING."""
        if self.is_running():
            raise RedisServerError(f"redis-server on port {self._port} is already running")
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=f"streamkit-redis-{self._port}-"))
        self._register()
        try:
            self._start_with_port_retries(
                _BIND_RETRIES, self._launch_and_wait, None if self._fixed_port else self._new_port
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _new_port(self) -> None:
        self._port = free_port(cluster_bus=self._cluster_enabled)

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL) and delete its directory.

        Safe to call more than once and on a server that was never started.
        """
        self._terminate(signal.SIGTERM, self._stop_timeout)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._unregister()

    def stop_leftover(self) -> None:
        self.stop()

    def close(self) -> None:
        self.stop()

    def kill(self) -> None:
        """SIGKILL the process, keeping its directory, to simulate a crash."""
        self._terminate(signal.SIGKILL, self._stop_timeout)

    def restart(self) -> Self:
        """Stop the process if it still runs, then start it on the same port and dir.

        Nothing is persisted (``save ""``, no AOF), so a standalone server
        comes back empty; a cluster node keeps its ``nodes.conf`` identity.
        """
        self._terminate(signal.SIGTERM, self._stop_timeout)
        if self._dir is None:
            raise RedisServerError("restart() after stop(): the server directory is gone")
        # The port belonged to us before, so don't wander to another one: a
        # restarted server must keep its URL.
        self._register()
        self._launch_and_wait()
        return self

    # -- helpers ----------------------------------------------------------

    def client(self, **kwargs: Any) -> redis.Redis:
        """A synchronous redis-py client for this server; the caller closes it."""
        options: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0}
        options.update(kwargs)
        return redis.Redis(host=HOST, port=self._port, **options)

    def flushall(self) -> None:
        """Delete every key (``FLUSHALL SYNC``) so the next user starts clean."""
        with self.client() as conn:
            conn.flushall(asynchronous=False)

    def logs(self, lines: int | None = 30) -> str:
        """What the current launch wrote: its stderr, then its ``redis.log``."""
        if self._dir is None:
            return "(no directory)"
        parts = []
        for name, offset in (("stderr.log", 0), ("redis.log", self._redis_log_offset)):
            text = tail(self._dir / name, offset, lines)
            if text:
                parts.append(f"--- {name} ---\n{text}")
        return "\n".join(parts) or "(logs are empty)"

    def _command(self) -> list[str]:
        assert self._dir is not None
        cmd = [
            self._executable,
            "--port", str(self._port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "no",
            "--daemonize", "no",
            "--dir", str(self._dir),
            "--logfile", "redis.log",
        ]  # fmt: skip
        if self._cluster_enabled:
            cmd += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self._cluster_node_timeout_ms),
            ]  # fmt: skip
        cmd += self._extra_args
        return cmd

    def _launch_and_wait(self) -> None:
        assert self._dir is not None
        # Errors before the logfile is opened (bad arguments) go to stderr, so
        # keep that too for the diagnostics below.
        redis_log = self._dir / "redis.log"
        self._redis_log_offset = redis_log.stat().st_size if redis_log.exists() else 0
        self._output = self._dir / "stderr.log"
        self._spawn(
            self._command(), cwd=self._dir, append=False, die_with_parent=self._die_with_parent
        )
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._startup_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                logs = self.logs()
                if "Address already in use" in logs:
                    raise _PortTakenError(self._port, logs)
                raise RedisServerError(
                    f"redis-server on port {self._port} exited with code {code} during "
                    f"start-up; log tail:\n{logs}"
                )
            try:
                # No retries: redis-py's default backoff could make one probe
                # outlast the whole start-up timeout, hiding an early exit.
                probe = self.client(
                    socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
                )
                with probe as conn:
                    # The server that answers must be ours: when two servers
                    # were handed one port, the second one's PING reaches the
                    # first before the second exits with "Address already in use".
                    if conn.ping() and conn.info("server")["process_id"] == self._proc.pid:
                        return
            except (RedisConnectionError, RedisTimeoutError, BusyLoadingError) as exc:
                last_error = exc
            time.sleep(0.05)
        self._terminate(signal.SIGKILL, self._stop_timeout)
        raise RedisServerError(
            f"redis-server on port {self._port} did not answer PING within "
            f"{self._startup_timeout:.1f}s (last error: {last_error!r}); log tail:\n{self.logs()}"
        )
