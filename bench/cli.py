"""Start-up of the commands a person types, against a bare interpreter start.

    python bench/cli.py [--runs 7]

Measured in one run, each the median wall time of ``--runs`` starts:

* baseline: ``python -c pass`` (the interpreter of this venv);
* ``streamkit --version`` and ``streamkit --help`` (target: within 0.25 s of
  the baseline), ``streamkit status --help`` (typer converts a command's
  parameters with pydantic) and ``streamkit-server --version`` and ``--help``
  (the latter prints the settings model's descriptions);
* ``streamkit status`` of an 8-shard group with two members (target: under
  1 s), against a private Redis and coordinator started here;
* ``streamkit run samples.orders.app:app``: from the process start to its
  first heartbeat answered (the ``assigned shards`` log line; target: 1.5 s);
* ``streamkit dev samples.orders.app:app``: from the command to the first
  published order handled (the order id in the sample's billed set;
  target: 10 s, the getting-started promise).

The machine's load is printed with the figures: on a shared 2-core machine
the ratios to the baseline are what compare between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

from streamkit import Publisher
from streamkit.demo.dev import client_env
from streamkit.settings import StreamKitSettings
from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess

ROOT = Path(__file__).resolve().parents[1]
STREAMKIT = [str(Path(sys.executable).with_name("streamkit"))]
# The orders sample's names (samples/orders/app.py; run from the checkout).
ORDERS, BILLING, BILLED = "orders", "billing", "samples:orders:billed"


Sample = tuple[float, float | None]  # wall seconds, CPU seconds of the process (if known)


def median(runs: int, once: Callable[[], Sample]) -> Sample:
    samples = [once() for _ in range(runs)]
    cpu = [c for _, c in samples if c is not None]
    return statistics.median(w for w, _ in samples), statistics.median(cpu) if cpu else None


def wall(command: list[str], env: dict[str, str] | None = None) -> Sample:
    """Wall time of the command, and the CPU (user + system) it used."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return elapsed, usage.ru_utime + usage.ru_stime


def _cpu_so_far(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def until_line(command: list[str], env: dict[str, str], needle: str) -> Sample:
    """Seconds (and CPU) from the process start to ``needle`` on its stderr; then SIGTERM."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if needle in line:
                return time.perf_counter() - started, _cpu_so_far(proc.pid)
        raise RuntimeError(f"{command} ended without {needle!r}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        proc.stderr.close()


def dev_first_order(env: dict[str, str], order_id: str) -> Sample:
    """Seconds from ``streamkit dev`` to the first published order billed."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*STREAMKIT, "dev", "samples.orders.app:app"],
        env={**env, "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        exports = next(line for line in proc.stdout if line.startswith("export "))
        settings = dict(item.split("=", 1) for item in exports.split()[1:])
        next(line for line in proc.stderr if "assigned shards" in line)
        client = StreamKitSettings(
            **{k.removeprefix("STREAMKIT_").lower(): v for k, v in settings.items()}
        )
        asyncio.run(_publish(client, order_id))
        data = redis.Redis.from_url(settings["STREAMKIT_REDIS_URL"])
        while not data.sismember(BILLED, order_id):
            time.sleep(0.01)
        data.close()
        return time.perf_counter() - started, None  # three processes: no one CPU figure
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
        proc.stdout.close()
        proc.stderr.close()


async def _publish(settings: StreamKitSettings, order_id: str) -> None:
    order = json.dumps({"order_id": order_id, "amount": "1.00"})
    async with Publisher(ORDERS, BILLING, settings=settings) as publisher:
        await publisher.publish(order_id, {"payload": order})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    figures: dict[str, Sample] = {}
    figures["python -c pass"] = median(runs, lambda: wall([sys.executable, "-c", "pass"]))
    figures["streamkit --version"] = median(runs, lambda: wall([*STREAMKIT, "--version"]))
    figures["streamkit --help"] = median(runs, lambda: wall([*STREAMKIT, "--help"]))
    figures["streamkit status --help"] = median(
        runs, lambda: wall([*STREAMKIT, "status", "--help"])
    )
    coord = [sys.executable, "-m", "streamkit_server"]
    figures["streamkit-server --version"] = median(runs, lambda: wall([*coord, "--version"]))
    figures["streamkit-server --help"] = median(runs, lambda: wall([*coord, "--help"]))
    with (
        RedisServer() as server,
        CoordinatorProcess(server.url, heartbeat_interval_ms=3_000, member_lease_ttl_ms=15_000,
                           rebalance_timeout_ms=60_000, tick_interval_ms=1_000) as coordinator,
    ):  # fmt: skip
        env = {**clean, **client_env(coordinator, server.url, cluster=False)}
        run = [*STREAMKIT, "run", "samples.orders.app:app"]
        # The first start creates the sample's streams (8 shards for orders).
        first, _ = until_line(run, env, "assigned shards")
        figures["streamkit run: first heartbeat answered"] = median(
            runs, lambda: until_line(run, env, "assigned shards")
        )
        with subprocess.Popen(run, env=env, cwd=ROOT, stderr=subprocess.DEVNULL) as members:
            time.sleep(3)  # two members holding the 8 shards
            status = [*STREAMKIT, "status", ORDERS, BILLING]
            figures["streamkit status (8 shards)"] = median(runs, lambda: wall(status, env))
            members.terminate()
    orders = iter(range(runs * 2))
    figures["streamkit dev: first order handled"] = median(
        max(3, runs // 2), lambda: dev_first_order(clean, f"bench-{next(orders)}")
    )
    base, _ = figures["python -c pass"]
    load = os.getloadavg()[0]
    print(f"cli start-up, median of {runs} (load average {load:.1f}, {os.cpu_count()} CPUs)")
    print(f"  (first streamkit run, creating the streams: {first:.2f} s)")
    print(f"  {'':42s} {'wall':>7s} {'over base':>10s} {'CPU':>7s}")
    for name, (seconds, cpu) in figures.items():
        over = "" if name == "python -c pass" else f"+{seconds - base:.2f} s"
        used = "-" if cpu is None else f"{cpu:.2f} s"
        print(f"  {name:42s} {seconds:5.2f} s {over:>10s} {used:>7s}")


if __name__ == "__main__":
    main()
