"""The base every test-process launcher shares (``streamkit.testing.process``),
on real child processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import anyio
import pytest
from helpers import sigterm_then_kill

from streamkit.testing import process
from streamkit.testing.coordinator import CoordinatorProcessError
from streamkit.testing.process import ManagedProcess


class Sleeper(ManagedProcess):
    """Prints a line per start, then sleeps until stopped."""

    def start(self) -> Self:
        code = "import sys, time; print('started', flush=True); time.sleep(60)"
        self._spawn([sys.executable, "-c", code])
        deadline = time.monotonic() + 10
        while "started" not in self.logs():
            assert time.monotonic() < deadline, self.logs()
            time.sleep(0.02)
        return self

    def close(self) -> None:
        self._terminate(signal.SIGTERM, 5.0)
        self._unregister()


def test_logs_show_the_current_launch_and_close_stops_by_pid(tmp_path: Path) -> None:
    sleeper = Sleeper(tmp_path / "out.log")
    with sleeper:
        first = sleeper.pid
        assert sleeper.is_running() and sleeper in process._live
        assert sleeper.logs() == "started"
    assert not sleeper.is_running() and sleeper not in process._live
    with sleeper:  # a restart appends to the file; logs() shows this launch only
        assert sleeper.pid != first
        assert sleeper.logs() == "started"
    assert (tmp_path / "out.log").read_text().count("started") == 2


def test_the_launchers_old_error_name_still_works_and_warns() -> None:
    from streamkit.testing import coordinator

    with pytest.warns(DeprecationWarning, match="CoordinatorProcessError"):
        assert coordinator.CoordinatorError is CoordinatorProcessError


@pytest.mark.parametrize(
    ("ignores_sigterm", "signal_number"), [(False, signal.SIGTERM), (True, signal.SIGKILL)]
)
def test_sigterm_then_kill_ends_the_process_either_way(
    ignores_sigterm: bool, signal_number: int
) -> None:
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignores_sigterm else ""
    code = f"import signal, time; {ignore}print('ready', flush=True); time.sleep(60)"
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        anyio.run(sigterm_then_kill, proc, 0.5)
        assert proc.returncode == -signal_number
