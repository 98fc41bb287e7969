"""The ``redis-oom`` fault: a Redis primary at ``maxmemory`` for a few seconds.

``maxmemory`` is set just above the memory the primary uses, with
``maxmemory-policy noeviction``: the load fills the little headroom left
(up to 3 s), then Redis refuses every command that adds data (``XADD``, the
coordinator's metadata writes, ``HSET``...) with ``-OOM``, while reads,
``XACK`` and deletions still work.  The limit is then pinned at half the
used memory for 2-4 s, so the few kilobytes consumers free by deleting
acknowledged entries do not end the fault; then the previous limit is
restored.

While Redis refuses, the fault sends the coordinator a join heartbeat of a
member of its own (``oom-probe``): it must be answered, ``503
REDIS_OUT_OF_MEMORY`` when the write is refused, never a 500.  A join that
got through (memory freed meanwhile) is left at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio

#: Room left above the used memory: a few seconds of the soak's writes on
#: standalone (on a cluster a primary gets a third of them and the 3 s
#: filling often ends first: the pin follows either way).
HEADROOM_BYTES = 16 * 1024
PROBE_MEMBER = "oom-probe"


@dataclass
class OomWindow:
    port: int
    #: From the pin below the used memory to the restore.
    start_ns: int
    end_ns: int
    #: Commands Redis refused with OOM (its ``errorstat_OOM`` counter), from
    #: the first ``CONFIG SET`` on, the filling included.
    refused: int


@dataclass
class OomLog:
    windows: list[OomWindow] = field(default_factory=list)
    #: The coordinator's answers to the probe while Redis refused writes.
    answers: Counter[str] = field(default_factory=Counter)


async def _refusals(conn: redis.asyncio.Redis) -> int:
    stats: dict[str, Any] = await conn.info("errorstats")
    entry = stats.get("errorstat_OOM") or {}
    return int(entry.get("count", 0)) if isinstance(entry, dict) else 0


async def squeeze(
    conn: redis.asyncio.Redis,
    port: int,
    hold_s: float,
    log: OomLog,
    note: Callable[[str], None],
    probe: Callable[[], Any] | None,
) -> None:
    """Redis at ``port`` (``conn`` reaches it directly) at maxmemory for ``hold_s``."""
    previous = await conn.config_get("maxmemory", "maxmemory-policy")
    before = await _refusals(conn)
    used = int((await conn.info("memory"))["used_memory"])
    await conn.config_set("maxmemory-policy", "noeviction")
    await conn.config_set("maxmemory", used + HEADROOM_BYTES)
    try:
        for _ in range(60):  # 3 s
            if await _refusals(conn) > before:
                break
            await asyncio.sleep(0.05)
        filled = await _refusals(conn) > before
        # Pinned well below the use: at the limit, memory the consumers free
        # (deleted entries) and that closed connections give back lets a write
        # through now and then; with the soak's one slow writer that would
        # end the fault at once, while a busy Redis would stay full.
        used = int((await conn.info("memory"))["used_memory"])
        await conn.config_set("maxmemory", max(1, used // 2))
        if not filled:
            note(f"Redis {port}: the load did not fill the headroom in 3 s")
        start = time.monotonic_ns()
        note(f"Redis {port} full (used {used} bytes), refusing writes for {hold_s:.1f}s")
        end_at = time.monotonic() + hold_s
        if probe is not None:
            await asyncio.sleep(min(0.5, hold_s / 2))
            log.answers[await probe()] += 1
        await asyncio.sleep(max(0.0, end_at - time.monotonic()))
    finally:
        await conn.config_set("maxmemory", previous.get("maxmemory") or "0")
        await conn.config_set("maxmemory-policy", previous.get("maxmemory-policy") or "noeviction")
    refused = await _refusals(conn) - before
    log.windows.append(OomWindow(port, start, time.monotonic_ns(), refused))
    note(f"Redis {port} memory restored; {refused} commands were refused with OOM")


async def probe_heartbeat(url: str, auth: tuple[str, str], prefix: str, group: str) -> str:
    """A join heartbeat of ``oom-probe``: the answer as ``status errorCode``."""
    path = f"/coord/v1/streams/{prefix}/groups/{group}/members/{PROBE_MEMBER}/heartbeat"
    body: dict[str, Any] = {
        "protocolVersion": 1,
        "requestId": "oom-probe",
        "memberId": PROBE_MEMBER,
        "memberEpoch": 0,
        "metadataVersion": 0,
        "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1},
    }
    async with httpx.AsyncClient(base_url=url, auth=auth, timeout=5) as http:
        try:
            answer = await http.post(path, json=body)
        except httpx.HTTPError as exc:  # a dropped answer, a killed coordinator
            return f"no answer ({type(exc).__name__})"
        if answer.status_code == 200:
            # Memory was freed in between and the join went through: leave.
            version = answer.json().get("metadataVersion") or 0
            leave = dict(body, requestId="oom-probe-leave", memberEpoch=-1, metadataVersion=version)
            try:
                await http.post(path, json=leave)
            except httpx.HTTPError:
                pass  # its lease ends on its own
            return "200"
        try:
            code = answer.json().get("errorCode", "?")
        except ValueError:
            code = "not JSON"
        return f"{answer.status_code} {code}"
