"""Every coordinator process on one Redis runs with the same timing settings.

A lease written by one process is judged by another: a process with a shorter
``MEMBER_LEASE_TTL_MS`` would expire members that another process promised a
longer lease, and hand their shards to a second reader while the first still
reads. So the timings are not a per-process choice. Each process registers
its timings in one hash (``{kp}:coordinators``, field = coordinator id,
value = ``<bound until ms>|<timings>[|stopped]``) and refreshes the entry from
its tick loop; a process whose timings differ from an entry still binding is
refused at start-up.

An entry binds while its process runs and, after that, for as long as a lease
it granted may still run: a stopping process leaves its entry binding for its
member lease or producer routing lease (the longer one), and a crashed one's
lapses ``LIVE_MS`` (or that lease, if longer) after its last refresh.  Without
that, stopping every coordinator and starting them at once with a shorter
lease would expire members whose old, longer lease still lets them read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from redis.exceptions import RedisError

from streamkit_server.core import CoordinatorConfig
from streamkit_server.store import scripts
from streamkit_server.store.keys import coordinators_key
from streamkit_server.store.records import RedisClient

__all__ = ["LIVE_MS", "TimingConflict", "Timings", "coordinators_key", "differences", "encode"]

log = logging.getLogger("streamkit_server.timings")

#: A running process' entry binds this long past its last refresh (at least).
LIVE_MS: Final = 30_000


# A stopping process' entry stays, binding for as long as its leases may run
# (ARGV: id, encoded timings, ms).  Only an entry still there: one that lapsed
# while the process stalled is not brought back.
_STOP = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], (now + tonumber(ARGV[3])) .. '|' .. ARGV[2] .. '|stopped')
return 1
"""

# (encoded name, setting) of what every process must agree on.
_FIELDS: Final = (
    ("heartbeatIntervalMs", "HEARTBEAT_INTERVAL_MS"),
    ("memberLeaseTtlMs", "MEMBER_LEASE_TTL_MS"),
    ("rebalanceTimeoutMs", "REBALANCE_TIMEOUT_MS"),
    ("producerRoutingLeaseMs", "PRODUCER_ROUTING_LEASE_MS"),
)


def encode(config: CoordinatorConfig) -> str:
    """The timings as one comparable string, e.g. ``heartbeatIntervalMs=3000,...``."""
    values = (
        config.heartbeat_interval_ms,
        config.member_lease_ttl_ms,
        config.rebalance_timeout_ms,
        config.producer_routing_lease_ms,
    )
    return ",".join(f"{name}={value}" for (name, _), value in zip(_FIELDS, values, strict=True))


def differences(mine: str, theirs: str) -> str:
    """The settings two encoded timings disagree on, for an operator."""
    ours = dict(part.split("=", 1) for part in mine.split(",") if "=" in part)
    other = dict(part.split("=", 1) for part in theirs.split(",") if "=" in part)
    out = [
        f"STREAMKIT_SERVER_{setting} is {ours.get(name)} here and {other.get(name)} there"
        for name, setting in _FIELDS
        if name in ours and name in other and ours[name] != other[name]
    ]
    return "; ".join(out) or f"their timings are {theirs!r}"


class TimingConflict(Exception):
    """A live coordinator process on this Redis runs with other timings."""


@dataclass
class Timings:
    """This process' entry in the registry of coordinator processes."""

    client: RedisClient
    key_prefix: str
    coordinator_id: str
    config: CoordinatorConfig

    def __post_init__(self) -> None:
        self._script = self.client.register_script(scripts.REGISTER_TIMINGS)
        self._stop = self.client.register_script(_STOP)
        self._encoded = encode(self.config)
        self._warned_about: str | None = None
        # How long a lease this process grants may run: members' or producers'.
        self._lease_ms = max(self.config.member_lease_ttl_ms, self.config.producer_routing_lease_ms)

    async def register(self) -> None:
        """Add or refresh this process' entry; ``TimingConflict`` if a binding one differs."""
        key = coordinators_key(self.key_prefix)
        hold = max(LIVE_MS, self._lease_ms)
        reply = await self._script(keys=[key], args=[self.coordinator_id, self._encoded, hold])
        if int(reply[0]) == 1:
            if self._warned_about is not None:
                log.warning("this coordinator's timings are registered again; serving")
            self._warned_about = None
            return
        other, theirs = (v.decode() if isinstance(v, bytes) else str(v) for v in reply[1:3])
        wait_s = -(-int(reply[3]) // 1000)  # rounded up
        what = differences(self._encoded, theirs)
        if int(reply[4]):
            raise TimingConflict(
                f"coordinator {other} stopped on this Redis with other timings ({what}), "
                f"and leases it granted may still run for up to {wait_s} s: a member it "
                "promised a longer lease would be expired here while it still reads. Start "
                f"this one with the same values, or in {wait_s} s"
            )
        raise TimingConflict(
            f"coordinator {other} on this Redis runs with other timings ({what}); every "
            "coordinator sharing a Redis must use the same ones, because a lease one "
            "process grants is judged by another. Give this one the same values, or stop "
            "every coordinator first to change them (after a stop, or a crash, the old "
            f"timings bind until the leases granted under them have run out: {wait_s} s "
            "from now at most)"
        )

    async def register_at_start(self) -> None:
        """``register``; a Redis that cannot take the write yet (a read-only
        replica behind the endpoint) only defers it to the tick loop's refresh."""
        try:
            await self.register()
        except (RedisError, OSError) as exc:
            log.warning("could not register this coordinator's timings yet: %s", exc)

    async def refresh(self) -> TimingConflict | None:
        """``register`` from the tick loop: a conflict is logged (once) and returned.

        Only possible if this process' entry lapsed (it stalled past its
        binding time) or it could not register at start-up, and another
        process with other timings registered meanwhile.
        """
        try:
            await self.register()
        except TimingConflict as exc:
            if self._warned_about != str(exc):
                self._warned_about = str(exc)
                log.error("%s; refusing to decide anything until that is resolved", exc)
            return exc
        return None

    async def mark_stopped(self) -> None:
        """This process stops: its entry binds on until the leases it granted ran out."""
        key = coordinators_key(self.key_prefix)
        await self._stop(keys=[key], args=[self.coordinator_id, self._encoded, self._lease_ms])
