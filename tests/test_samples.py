"""The samples and ``streamkit demo`` run as a newcomer would run them.

Each sample is started with ``python -m streamkit run samples.<name>.app:app``
as a real subprocess, against the session's standalone redis-server and a real
coordinator process (``coordinator`` fixture), then stopped with SIGTERM.  The
demo brings its own Redis and coordinator.  Cluster parity of the runtime is
covered by the consumer and producer suites, so these run on standalone only.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    REPO,
    Admin,
    AppProcess,
    create_group,
    eventually,
    in_process_settings,
    logical,
)

from samples.orders.app import Order
from streamkit import Publisher, StreamKitSettings
from streamkit.demo.dev import client_env as dev_client_env
from streamkit.routing import shard_for_key
from streamkit.testing import RedisTarget, redis_client
from streamkit.testing.coordinator import CoordinatorProcess

pytestmark = pytest.mark.slow
standalone_only = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)


# -- helpers -----------------------------------------------------------------------------


async def members(coordinator: CoordinatorProcess, prefix: str, group: str) -> list[dict[str, Any]]:
    view = await Admin(coordinator).get_json(f"/monitoring/streams/{prefix}/groups/{group}/members")
    result: list[dict[str, Any]] = view["members"]
    return result


def client_env(coordinator: CoordinatorProcess, target: RedisTarget, base: str) -> dict[str, str]:
    """The ``STREAMKIT_*`` variables a sample needs (the getting-started set)."""
    return {
        **dev_client_env(coordinator, target.url, target.cluster),
        "STREAMKIT_MEMBER_ID_BASE": base,
    }


@asynccontextmanager
async def sample(target: str, env: dict[str, str], log_path: Path) -> AsyncIterator[AppProcess]:
    proc = AppProcess(target, env, log_path).start()
    try:
        yield proc
    finally:
        proc.cleanup()  # by pid, only if a failed assertion left it running


async def assert_left_gracefully(
    proc: AppProcess, coordinator: CoordinatorProcess, prefix: str, group: str, ids: list[str]
) -> None:
    proc.assert_running()
    code = await proc.terminate()
    logs = proc.logs(None)
    assert code == 0, f"exit status {code} after SIGTERM:\n{logs}"
    assert "SIGTERM: draining and leaving" in logs, logs
    for member_id in ids:
        assert f"{member_id}: left the group" in logical(logs), logs
    # The coordinator saw a leave (epoch -1), not a lease expiry.
    states = {logical(m["memberId"]): m for m in await members(coordinator, prefix, group)}
    for member_id in ids:
        assert states[member_id]["state"] == "LEAVING", states
        assert states[member_id]["currentAssignment"] == [], states


# -- samples/orders ----------------------------------------------------------------------

ORDERS, BILLING, INVOICES, ACCOUNTING = "orders", "billing", "invoices", "accounting"
BILLED, DELIVERIES = "samples:orders:billed", "samples:orders:deliveries"


@standalone_only
async def test_orders_sample_bills_every_order_once(
    coordinator: CoordinatorProcess, any_redis: RedisTarget, tmp_path: Path
) -> None:
    orders_shards, invoice_shards, count = 4, 2, 300
    await create_group(coordinator, ORDERS, BILLING, orders_shards)
    await create_group(coordinator, INVOICES, ACCOUNTING, invoice_shards)
    base = "samples-orders"
    env = client_env(coordinator, any_redis, base)
    redis: Any = redis_client(any_redis)
    try:
        async with sample("samples.orders.app:app", env, tmp_path / "orders.log") as proc:
            order_ids = [f"order-{i}" for i in range(count)]
            settings = StreamKitSettings(**in_process_settings(coordinator, any_redis, "pub"))
            async with Publisher(ORDERS, BILLING, settings=settings) as publisher:
                results = await publisher.publish_many(
                    (oid, Order(order_id=oid, amount=Decimal(f"{i % 97}.50")))
                    for i, oid in enumerate(order_ids)
                )
                # Not an Order: dead-lettered at once, with the validation error.
                invalid = await publisher.publish_json("order-x", {"order_id": "order-x"})
            assert len(results) == count

            async def all_billed() -> bool:
                proc.assert_running()
                return int(await redis.scard(BILLED)) >= count

            await eventually(all_billed, 20, f"{count} billed orders", 0.1, proc.logs)
            billed = {m.decode() for m in await redis.smembers(BILLED)}
            assert billed == set(order_ids)
            # The set hides duplicates; the delivery counter does not.  A run
            # without faults hands every order to the handler exactly once.
            assert int(await redis.get(DELIVERIES)) == count

            # One invoice per order, on the shard its order id routes to.
            invoiced: list[str] = []
            for shard in range(invoice_shards):
                for _id, fields in await redis.xrange(f"{INVOICES}:{shard}"):
                    order_id = fields[b"orderId"].decode()
                    assert shard_for_key(order_id, invoice_shards) == shard
                    invoiced.append(order_id)
            duplicated = {oid: n for oid, n in Counter(invoiced).items() if n != 1}
            assert not duplicated, duplicated
            assert sorted(invoiced) == sorted(order_ids)

            async def dead_lettered() -> bool:
                return int(await redis.xlen(f"{ORDERS}/dlq/{BILLING}")) == 1

            await eventually(dead_lettered, 10, "the invalid order dead-lettered", proc.logs)
            ((_, letter),) = await redis.xrange(f"{ORDERS}/dlq/{BILLING}")
            assert letter[b"x-original-id"].decode() == invalid.record_id
            assert b"amount" in letter[b"x-error"] and letter[b"x-attempts"] == b"1"

            for shard in range(orders_shards):
                pending = await redis.xpending(f"{ORDERS}:{shard}", BILLING)
                assert pending["pending"] == 0, (shard, pending)

            await assert_left_gracefully(
                proc, coordinator, ORDERS, BILLING, [f"{base}-m0", f"{base}-m1"]
            )
    finally:
        await redis.aclose()


# -- samples/custom_reader ---------------------------------------------------------------

AUDIT, AUDITOR, COUNTS = "audit", "auditor", "samples:audit:counts"


@standalone_only
async def test_custom_reader_sample_counts_and_acks_everything(
    coordinator: CoordinatorProcess, any_redis: RedisTarget, tmp_path: Path
) -> None:
    shards, count = 4, 200
    await create_group(coordinator, AUDIT, AUDITOR, shards)
    base = "samples-audit"
    redis: Any = redis_client(any_redis)
    try:
        async with sample(
            "samples.custom_reader.app:app",
            client_env(coordinator, any_redis, base),
            tmp_path / "audit.log",
        ) as proc:
            for i in range(count):
                await redis.xadd(f"{AUDIT}:{i % shards}", {"event": f"e{i}"}, nomkstream=True)

            async def counted_and_acked() -> bool:
                proc.assert_running()
                counts = await redis.hvals(COUNTS)
                if sum(int(c) for c in counts) < count:
                    return False
                for shard in range(shards):
                    if (await redis.xpending(f"{AUDIT}:{shard}", AUDITOR))["pending"]:
                        return False
                return True

            await eventually(counted_and_acked, 20, f"{count} audited entries", 0.1, proc.logs)
            counts = {int(k): int(v) for k, v in (await redis.hgetall(COUNTS)).items()}
            assert counts == {shard: count // shards for shard in range(shards)}

            await assert_left_gracefully(
                proc, coordinator, AUDIT, AUDITOR, [f"{base}-m0", f"{base}-m1"]
            )
    finally:
        await redis.aclose()


# -- streamkit demo ----------------------------------------------------------------------

_SUMMARY = re.compile(
    r"published=(?P<published>\d+) acked=(?P<acked>\d+) "
    r"duplicates=(?P<duplicates>-?\d+) lost=(?P<lost>-?\d+)"
)


@pytest.mark.redis  # starts its own private redis-server and coordinator
def test_demo_runs_and_loses_nothing() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamkit", "demo", "--duration", "10"],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = proc.communicate(timeout=75)
    except subprocess.TimeoutExpired:
        # SIGINT lets the demo stop its consumers, coordinator and Redis.
        proc.send_signal(signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        pytest.fail(f"streamkit demo --duration 10 did not finish:\n{output}")
    assert proc.returncode == 0, output
    # The console link and credentials come first, so a newcomer can watch.
    assert re.search(r"console: http://\S+/console/#/group/orders/billing", output), output
    assert "sign in as admin with password" in output, output
    last = [line for line in output.splitlines() if line.strip()][-1].strip()
    match = _SUMMARY.fullmatch(last)
    assert match is not None, f"unexpected last line {last!r}:\n{output}"
    assert match["lost"] == "0", output
    assert int(match["published"]) > 0, output
    assert int(match["acked"]) == int(match["published"]), output
    # Not a terminal: plain log lines, never wrapped, each event once.
    lines = output.splitlines()
    assert sum("scaling orders from 8 to 12 shards" in line for line in lines) == 1, output
    status_lines = [line for line in lines if " published=" in line]
    assert status_lines, output
    assert all("assignmentEpoch=" in line for line in status_lines), output
