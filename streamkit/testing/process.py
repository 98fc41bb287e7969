"""``ManagedProcess``: what every launcher of a real test process shares.

``redis-server`` (:class:`~streamkit.testing.redis_server.RedisServer`), the
coordinator (:class:`~streamkit.testing.coordinator.CoordinatorProcess`) and
the tests' ``streamkit run`` apps are all started the same way:

* on a free loopback port (another one is picked when the port was taken
  between the probe and the bind, unless the port was fixed);
* in a session of their own, so a Ctrl-C in the terminal reaches only the
  test run, which shuts them down in order;
* killed by the kernel when the test process dies (``PR_SET_PDEATHSIG`` on
  Linux), and by an ``atexit`` hook otherwise: no leaked servers;
* torn down by their PID only, never by name, so other users of the machine
  (other test sessions, a system Redis on 6379) are left alone;
* with their output in a log file, of which ``logs()`` shows what the current
  launch wrote (diagnostics for a failed start).

The launchers are deliberately synchronous: they run once per fixture or demo
start-up, and ``subprocess.Popen`` plus short polling is the simplest thing
that is obviously correct.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = [
    "CLUSTER_BUS_PORT_OFFSET",
    "HOST",
    "Launched",
    "ManagedProcess",
    "PortTakenError",
    "die_with_parent_hook",
    "free_port",
    "tail",
]

HOST = "127.0.0.1"
#: Redis Cluster nodes talk to each other on ``port + 10000``.
CLUSTER_BUS_PORT_OFFSET = 10000
_PR_SET_PDEATHSIG = 1
_LOG_TAIL_LINES = 30


class PortTakenError(RuntimeError):
    """The process could not bind its port: someone took it after ``free_port``."""


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
    raise RuntimeError(f"no free loopback port found after {attempts} attempts")


def die_with_parent_hook() -> Callable[[], None] | None:
    """Build a ``preexec_fn`` that SIGKILLs the child when this process dies.

    Without it a crashed or SIGKILLed test run leaks its processes. Linux
    delivers PDEATHSIG when the *thread* that forked exits, so the hook is
    only used from the main thread; elsewhere the ``atexit`` hook remains.
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


def tail(path: Path, offset: int = 0, lines: int | None = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``path`` from byte ``offset`` on (all with
    None; '' if unreadable)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return text if lines is None else "\n".join(text.splitlines()[-lines:])


_live: set[ManagedProcess] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_leftovers() -> None:
    # Last line of defence for callers that forgot to stop one (or a demo that
    # was interrupted): never leave a process behind.
    with _live_lock:
        leftovers = list(_live)
    for process in leftovers:
        with contextlib.suppress(Exception):
            process.stop_leftover()


class Launched:
    """What a launcher is used as: ``with launcher:`` starts it unless it runs
    already, and closes it (stops it, removes what it left) on the way out."""

    def start(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def is_running(self) -> bool:
        raise NotImplementedError

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
        self.close()


class ManagedProcess(Launched):
    """One child process at a time, its stdout and stderr in the file ``output``.

    Subclasses say what to start and when it is ready, and how to stop what is
    left at exit (``stop_leftover``); this class spawns, signals, waits and
    reads the output.
    """

    def __init__(self, output: Path | None = None) -> None:
        self._output = output
        self._proc: subprocess.Popen[bytes] | None = None
        # The output is appended to across restarts; logs() shows the current launch.
        self._output_offset = 0

    @property
    def log_path(self) -> Path | None:
        """Where the process writes (its stdout and stderr)."""
        return self._output

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def logs(self, lines: int | None = 60) -> str:
        """Tail of what the current launch wrote (all of it with None)."""
        if self._output is None:
            return ""
        return tail(self._output, self._output_offset, lines)

    def stop_leftover(self) -> None:
        """Called at interpreter exit for a process still registered (default: SIGKILL)."""
        self._terminate(signal.SIGKILL, 10.0)

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<{type(self).__name__} {self.url} pid={self.pid} {state}>"

    @property
    def url(self) -> str:
        """Where it listens (launchers of servers say)."""
        return "-"

    # -- for subclasses --------------------------------------------------------

    def _spawn(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        append: bool = True,
        die_with_parent: bool = True,
    ) -> subprocess.Popen[bytes]:
        """Start ``args`` in a session of its own, stdout and stderr to ``output``."""
        assert self._output is not None
        output = self._output
        self._output_offset = output.stat().st_size if append and output.exists() else 0
        with open(output, "ab" if append else "wb") as log:
            self._proc = subprocess.Popen(
                list(args),
                env=dict(env) if env is not None else None,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C in the terminal must reach only us, so
                # the process is shut down in order by our teardown.
                start_new_session=True,
                preexec_fn=die_with_parent_hook() if die_with_parent else None,
            )
        self._register()
        return self._proc

    def _register(self) -> None:
        with _live_lock:
            _live.add(self)

    def _unregister(self) -> None:
        with _live_lock:
            _live.discard(self)

    def _signal(self, sig: int) -> None:
        if self._proc is not None:
            self._proc.send_signal(sig)

    def _terminate(self, sig: int, timeout: float) -> int | None:
        """Send ``sig`` and wait up to ``timeout`` s (then SIGKILL); the exit status."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def _start_with_port_retries(
        self, attempts: int, launch: Callable[[], None], new_port: Callable[[], None] | None
    ) -> None:
        """``launch()``; on ``PortTakenError`` pick another port (``new_port``,
        None: the port is fixed) and try again, ``attempts`` times in all."""
        for attempt in range(attempts):
            try:
                launch()
                return
            except PortTakenError:
                if new_port is None or attempt == attempts - 1:
                    raise
                new_port()
