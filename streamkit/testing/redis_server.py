"""Launch private ``redis-server`` processes on free loopback ports.

This powers the real-Redis test fixtures and the embedded Redis of
``streamkit demo``. Every process gets its own temporary directory and is
always torn down by PID (never by name), so parallel users of the same machine
-- other test sessions, a system Redis on 6379 -- are left alone.

The launcher is deliberately synchronous: it runs once per fixture or demo
start-up, and ``subprocess.Popen`` plus short polling is the simplest thing
that is obviously correct.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

__all__ = [
    "CLUSTER_BUS_PORT_OFFSET",
    "CLUSTER_SLOTS",
    "HOST",
    "RedisCluster",
    "RedisNotInstalledError",
    "RedisServer",
    "RedisServerError",
    "free_port",
]

HOST = "127.0.0.1"
#: Redis Cluster nodes talk to each other on ``port + 10000``.
CLUSTER_BUS_PORT_OFFSET = 10000
CLUSTER_SLOTS = 16384

_INSTALL_HINT = "install it with: apt-get update && apt-get install -y redis-server"
_LOG_TAIL_LINES = 30
# A few retries cover the unavoidable race between free_port() releasing its
# probe socket and redis-server binding the port.
_BIND_RETRIES = 5
_PR_SET_PDEATHSIG = 1


class RedisServerError(RuntimeError):
    """A private redis-server could not be started, reached or configured."""


class RedisNotInstalledError(RedisServerError):
    """``redis-server`` or ``redis-cli`` is not on PATH."""


def _which(name: str, explicit: str | None) -> str:
    if explicit is not None:
        if not os.access(explicit, os.X_OK):
            raise RedisNotInstalledError(f"{explicit!r} is not an executable; {_INSTALL_HINT}")
        return explicit
    found = shutil.which(name)
    if found is None:
        raise RedisNotInstalledError(f"{name!r} was not found on PATH; {_INSTALL_HINT}")
    return found


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # No SO_REUSEADDR: we want to fail on ports in TIME_WAIT too, exactly
        # like a fresh bind by another process might.
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(*, cluster_bus: bool = False, attempts: int = 200) -> int:
    """Return a TCP port on 127.0.0.1 that is free right now.

    With ``cluster_bus=True`` the port's cluster bus port (``port + 10000``)
    must be free as well, which also rules out ports above 55535.
    """
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if not cluster_bus:
            return port
        bus = port + CLUSTER_BUS_PORT_OFFSET
        if bus <= 65535 and _port_is_free(bus):
            return port
    raise RedisServerError(f"no free loopback port found after {attempts} attempts")


def _die_with_parent_hook() -> Callable[[], None] | None:
    """Build a ``preexec_fn`` that SIGKILLs the child when this process dies.

    Without it a crashed or SIGKILLed test run leaks redis-server processes.
    Linux delivers PDEATHSIG when the *thread* that forked exits, so the hook
    is only used from the main thread; elsewhere we rely on ``atexit``.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        # The parent may have died between fork() and prctl(); then the
        # signal will never come, so leave now.
        if os.getppid() != parent:
            os._exit(1)

    return hook


def _tail(path: Path, offset: int = 0, lines: int = _LOG_TAIL_LINES) -> str:
    """Last ``lines`` lines of ``path`` from byte ``offset`` on ('' if unreadable)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_live: set[RedisServer] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_leftovers() -> None:
    # Last line of defence for callers that forgot stop() (or a demo that was
    # interrupted): never leave a private redis-server behind.
    with _live_lock:
        leftovers = list(_live)
    for server in leftovers:
        with contextlib.suppress(Exception):
            server.stop()


def _info_dict(raw: object) -> dict[str, str]:
    """Normalise a ``CLUSTER INFO`` reply (dict or raw text) to ``str -> str``."""
    if isinstance(raw, Mapping):
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


class RedisServer:
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
        self._executable = _which("redis-server", executable)
        self._fixed_port = port is not None
        self._cluster_enabled = cluster_enabled
        self._port = port if port is not None else free_port(cluster_bus=cluster_enabled)
        self._cluster_node_timeout_ms = cluster_node_timeout_ms
        self._extra_args = tuple(extra_args)
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._die_with_parent = die_with_parent
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        # redis.log is appended to across restarts; diagnostics only look at
        # what the current launch wrote.
        self._log_offset = 0

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
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def dir(self) -> Path | None:
        """The server's working directory (``None`` before start / after stop)."""
        return self._dir

    @property
    def log_path(self) -> Path | None:
        return self._dir / "redis.log" if self._dir is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle --------------------------------------------------------

    def start(self) -> Self:
        """Start the server and block until it answers PING."""
        if self.is_running():
            raise RedisServerError(f"redis-server on port {self._port} is already running")
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=f"streamkit-redis-{self._port}-"))
        with _live_lock:
            _live.add(self)
        try:
            for attempt in range(_BIND_RETRIES):
                try:
                    self._launch_and_wait()
                    return self
                except _PortTakenError:
                    if self._fixed_port or attempt == _BIND_RETRIES - 1:
                        raise
                    self._port = free_port(cluster_bus=self._cluster_enabled)
        except BaseException:
            self.stop()
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL) and delete its directory.

        Safe to call more than once and on a server that was never started.
        """
        self._terminate(graceful=True)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        with _live_lock:
            _live.discard(self)

    def kill(self) -> None:
        """SIGKILL the process, keeping its directory, to simulate a crash."""
        self._terminate(graceful=False)

    def restart(self) -> Self:
        """Stop the process if it still runs, then start it on the same port and dir.

        Nothing is persisted (``save ""``, no AOF), so a standalone server
        comes back empty; a cluster node keeps its ``nodes.conf`` identity.
        """
        self._terminate(graceful=True)
        if self._dir is None:
            raise RedisServerError("restart() after stop(): the server directory is gone")
        # The port belonged to us before, so don't wander to another one: a
        # restarted server must keep its URL.
        with _live_lock:
            _live.add(self)
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
        self._log_offset = redis_log.stat().st_size if redis_log.exists() else 0
        with open(self._dir / "stderr.log", "wb") as stderr:
            self._proc = subprocess.Popen(
                self._command(),
                cwd=self._dir,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                # Own session: a Ctrl-C in the terminal must reach only us, so
                # the server is shut down in order by our teardown.
                start_new_session=True,
                preexec_fn=_die_with_parent_hook() if self._die_with_parent else None,
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
                logs = self._logs()
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
                    if conn.ping():
                        return
            except (RedisConnectionError, RedisTimeoutError, BusyLoadingError) as exc:
                last_error = exc
            time.sleep(0.05)
        self._terminate(graceful=False)
        raise RedisServerError(
            f"redis-server on port {self._port} did not answer PING within "
            f"{self._startup_timeout:.1f}s (last error: {last_error!r}); log tail:\n{self._logs()}"
        )

    def _logs(self) -> str:
        if self._dir is None:
            return "(no directory)"
        parts = []
        for name in ("stderr.log", "redis.log"):
            tail = _tail(self._dir / name, self._log_offset if name == "redis.log" else 0)
            if tail:
                parts.append(f"--- {name} ---\n{tail}")
        return "\n".join(parts) or "(logs are empty)"

    def _terminate(self, *, graceful: bool) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if graceful:
            proc.terminate()
            try:
                proc.wait(timeout=self._stop_timeout)
                return
            except subprocess.TimeoutExpired:
                pass
        proc.kill()
        proc.wait()

    # -- context manager --------------------------------------------------

    def __enter__(self) -> Self:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<RedisServer {self.url} pid={self.pid} {state}>"


class _PortTakenError(RedisServerError):
    def __init__(self, port: int, logs: str) -> None:
        super().__init__(
            f"port {port} (or its cluster bus port) is already in use; log tail:\n{logs}"
        )


class RedisCluster:
    """A Redis Cluster of ``primaries`` primaries and no replicas on loopback.

    Construction does not start anything; call :meth:`start` or use it as a
    context manager.
    """

    def __init__(
        self,
        primaries: int = 3,
        *,
        node_timeout_ms: int = 5000,
        startup_timeout: float = 60.0,
        executable: str | None = None,
        redis_cli: str | None = None,
        die_with_parent: bool = True,
    ) -> None:
        if primaries < 3:
            # redis-cli --cluster create refuses fewer than three primaries.
            raise ValueError("a Redis Cluster needs at least 3 primaries")
        self._redis_cli = _which("redis-cli", redis_cli)
        self._startup_timeout = startup_timeout
        self.nodes: list[RedisServer] = [
            RedisServer(
                cluster_enabled=True,
                cluster_node_timeout_ms=node_timeout_ms,
                executable=executable,
                die_with_parent=die_with_parent,
            )
            for _ in range(primaries)
        ]

    @property
    def url(self) -> str:
        """URL of the first node; cluster clients discover the rest from it."""
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(HOST, node.port) for node in self.nodes]

    def start(self) -> Self:
        """Start every node, create the cluster and wait until it is fully up."""
        try:
            for node in self.nodes:
                node.start()
            self._create()
            self._wait_until_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def flushall(self) -> None:
        """FLUSHALL every primary (all nodes are primaries here)."""
        for node in self.nodes:
            node.flushall()

    def cluster_info(self, node: RedisServer) -> dict[str, str]:
        with node.client() as conn:
            return _info_dict(conn.execute_command("CLUSTER INFO"))

    def _create(self) -> None:
        cmd = [
            self._redis_cli,
            "--cluster", "create",
            *(f"{HOST}:{node.port}" for node in self.nodes),
            "--cluster-replicas", "0",
            "--cluster-yes",
        ]  # fmt: skip
        try:
            result = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self._startup_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RedisServerError(
                f"redis-cli --cluster create timed out after {self._startup_timeout:.0f}s"
            ) from exc
        # redis-cli reports some failures with exit code 0, so also look for
        # its success banner.
        if result.returncode != 0 or "All 16384 slots covered" not in result.stdout:
            raise RedisServerError(
                f"redis-cli --cluster create failed (exit {result.returncode}):\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-2000:]}"
            )

    def _wait_until_ok(self) -> None:
        expected = {
            "cluster_state": "ok",
            "cluster_slots_assigned": str(CLUSTER_SLOTS),
            "cluster_slots_ok": str(CLUSTER_SLOTS),
            # Every node must know every other node and see all primaries
            # serving slots, or a client bootstrapping from it gets a partial
            # slot map.
            "cluster_known_nodes": str(len(self.nodes)),
            "cluster_size": str(len(self.nodes)),
        }
        deadline = time.monotonic() + self._startup_timeout
        last: dict[int, dict[str, str]] = {}
        while time.monotonic() < deadline:
            last = {node.port: self.cluster_info(node) for node in self.nodes}
            if all(
                all(info.get(key) == value for key, value in expected.items())
                for info in last.values()
            ):
                return
            time.sleep(0.1)
        summary = {port: {key: info.get(key) for key in expected} for port, info in last.items()}
        raise RedisServerError(
            f"cluster did not converge within {self._startup_timeout:.0f}s: {summary}"
        )

    def is_running(self) -> bool:
        return all(node.is_running() for node in self.nodes)

    def __enter__(self) -> Self:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<RedisCluster {', '.join(f'{h}:{p}' for h, p in self.startup_nodes)}>"
