"""How long a user's app tests take with the streamkit pytest plugin.

    python bench/app_tests.py

Runs the plugin's example suite (``samples/app_tests``: 20 tests of a billing
app on a real redis-server and coordinator, one of each for the session) in a
fresh pytest process, with ``-W error`` (so a pytest-asyncio deprecation
warning fails it), and reads each test's time (setup + call + teardown) from
pytest's ``--durations=0`` report (the last test's teardown, which stops the
session's servers, is printed apart):

* the first test, which starts the session's redis-server and coordinator
  (target: under 5 s);
* every further test (target: each under 1 s);
* the whole process, against a same-run baseline: the same pytest command
  with ``--collect-only`` (interpreter, pytest and its plugins, collection),
  printed as a ratio.

The machine's load is printed too: on a shared 2-core machine the ratio and
the in-session figures are what compare between runs.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

_PHASE = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S.*)$", re.M)
SUITE = Path(__file__).resolve().parents[1] / "samples" / "app_tests"


def run(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMKIT_", "PYTEST_"))}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"]
    started = time.perf_counter()
    result = subprocess.run(
        [*command, *args], cwd=SUITE, env=env, capture_output=True, text=True, timeout=300
    )
    return time.perf_counter() - started, result


def main() -> None:
    load = os.getloadavg()[0]
    baseline, _ = run("--collect-only")
    wall, result = run("--durations=0", "--durations-min=0", "-p", "no:randomly")
    if result.returncode != 0:
        sys.exit(f"the example suite failed:\n{result.stdout}{result.stderr}")
    collected = re.findall(r"^(test_\S+::\S+)", run("--collect-only")[1].stdout, re.M)
    phases: dict[str, dict[str, float]] = defaultdict(dict)
    for seconds, phase, test in _PHASE.findall(result.stdout):
        phases[test][phase] = float(seconds)
    last = collected[-1]
    session_teardown = phases[last].pop("teardown", 0.0)
    times = [sum(phases[test].values()) for test in collected]
    first, rest = times[0], times[1:]
    in_session = sum(times) + session_teardown
    print(f"load average at start: {load:.2f} (2 cores)")
    print(f"tests: {len(times)}, all passed, no warnings (-W error)")
    print(f"first test (starts redis-server + coordinator): {first:.2f} s  (target < 5 s)")
    print(
        f"further tests: median {statistics.median(rest):.2f} s, max {max(rest):.2f} s  "
        "(target: each < 1 s)"
    )
    print(f"session teardown (stops redis-server + coordinator): {session_teardown:.2f} s")
    print(f"in session: {in_session:.1f} s; process wall: {wall:.1f} s")
    print(f"baseline (same command, --collect-only): {baseline:.1f} s")
    print(f"suite wall / baseline: {wall / baseline:.2f}x; tests alone: {wall - baseline:.1f} s")


if __name__ == "__main__":
    main()
