"""N/N-1: the current tree beside the previous release on one Redis, under load.

The previous release is a pinned commit of this repository (``release.py``),
in a virtualenv of its own.  The tests under load judge as the chaos soak does:
0 lost, 0 overlapping reads, 0 reads without a lease, per-key order kept.

* ``test_old_and_new_side_by_side`` (default run, 18 to 30 s): an old and a
  new coordinator behind one balancer answer an old and a new consumer for
  10 s, every connection cut each second so each member's heartbeats go to
  both; the old release runs on this environment's dependencies (its
  isolated install costs 85 to 171 s, more than the CI budget).
* ``test_a_member_without_incarnation_heartbeats_to_both_releases`` (about
  10 s): a member that sends no incarnation, joined through the current tree,
  heartbeats to the old release.
* ``test_roll_forward_and_back`` (``-m long``, about 2 minutes, the old
  release's own install, built once and cached): a coordinator pair, a
  publisher and three consumers, all old, rolled to the current tree one
  process at a time and back.  Recorded in docs/operations.md.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest

from .release import PREVIOUS, available, previous_release
from .roll import Fleet, Side, summary

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not available(),
        reason=f"the previous release {PREVIOUS[:12]} is not in this clone (a shallow clone? "
        "fetch main's history, or name another commit in STREAMKIT_PREVIOUS_RELEASE)",
    ),
]


def _check(fleet: Fleet, verdict: object, began: float) -> None:
    from chaos.checks import Verdict

    assert isinstance(verdict, Verdict)
    report = f"{summary(verdict)} in {time.monotonic() - began:.0f} s (records in {fleet.workdir})"
    print(f"\n{report}\n" + "\n".join(fleet.notes))
    assert verdict.published > 0, report
    assert not verdict.lost, f"{report}\nLOST {verdict.lost[:30]}"
    assert not verdict.overlaps, f"{report}\n{verdict.overlaps[:5]}"
    assert not verdict.reads_without_lease, f"{report}\n{verdict.reads_without_lease[:5]}"
    assert not verdict.order_violations, f"{report}\n{verdict.order_violations[:5]}"
    assert verdict.handled == verdict.published, report


async def test_old_and_new_side_by_side(tmp_path: Path) -> None:
    old, new = Side.of(previous_release()), Side.current()
    fleet = Fleet(tmp_path, shards=4)
    began = time.monotonic()
    try:
        await fleet.start(coordinators=[old, new], consumers=[old, new], publisher=new)
        for _ in range(10):
            await asyncio.sleep(1.0)
            fleet.lb.cut()  # the next heartbeat of each member may go to the other release
        answered = await fleet.heartbeats_answered()
        verdict = await fleet.finish()
    finally:
        await fleet.close()
    _check(fleet, verdict, began)
    print(f"heartbeats answered: {answered}")
    # Both coordinators answered heartbeats, and both releases' members did the work.
    assert all(statuses.get("OK", 0) >= 5 for statuses in answered.values()), answered
    for name in ("old", "new"):
        (record,) = (f for f in fleet.record_files if f.name.endswith(f"-{name}.rec"))
        assert any(line.startswith("H ") for line in record.read_text().splitlines()), name


@pytest.mark.long
async def test_roll_forward_and_back(tmp_path: Path) -> None:
    isolated = os.environ.get("STREAMKIT_UPGRADE_ISOLATED", "1") != "0"
    old, new = Side.of(previous_release(isolated=isolated)), Side.current()
    dwell = float(os.environ.get("UPGRADE_DWELL_S", "5"))
    fleet = Fleet(tmp_path, shards=8)
    began = time.monotonic()
    try:
        await fleet.start(coordinators=[old, old], consumers=[old, old, old], publisher=old)
        await asyncio.sleep(dwell)
        await fleet.roll(new, dwell)
        await fleet.roll(old, dwell)
        verdict = await fleet.finish()
    finally:
        await fleet.close()
    _check(fleet, verdict, began)


async def test_a_member_without_incarnation_heartbeats_to_both_releases(tmp_path: Path) -> None:
    """A member of another client (no ``incarnation``, as the reference clients)
    joins through the current tree; its next heartbeat goes to the old release.

    The current tree binds such a member to the principal that joined it; it
    keeps that principal in a field of its own, which the old release ignores
    (stored as the incarnation, it made the old release fence the member).
    """
    old, new = Side.of(previous_release()), Side.current()
    fleet = Fleet(tmp_path, shards=2)
    try:
        await fleet.start(coordinators=[new, old], consumers=[], publisher=None)
        by_release = {side.name: proc for side, proc in fleet.coordinators}
        new_proc, old_proc = by_release["new"], by_release["old"]
        path = f"/coord/v1/streams/{fleet.prefix}/groups/{fleet.group}/members/m1/heartbeat"
        body = {
            "protocolVersion": 1,
            "requestId": "r0",
            "memberId": "m1",
            "memberEpoch": 0,
            "metadataVersion": 0,
            "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
        }
        async with httpx.AsyncClient(auth=new_proc.admin_auth, timeout=10) as http:
            joined = (await http.post(new_proc.url + path, json=body)).json()
            assert joined["status"] == "OK", joined
            again = dict(
                body,
                requestId="r1",
                memberEpoch=joined["memberEpoch"],
                metadataVersion=joined["metadataVersion"],
            )
            answer = (await http.post(old_proc.url + path, json=again)).json()
    finally:
        await fleet.close()
    assert answer["status"] == "OK", answer
