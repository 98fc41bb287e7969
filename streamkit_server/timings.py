"""Every coordinator process on one Redis runs with the same timing settings.

A lease written by one process is judged by another: a process with a shorter
``MEMBER_LEASE_TTL_MS`` would expire members that another process promised a
longer lease, and hand their shards to a second reader while the first still
reads. So the timings are not a per-process choice. Each process registers
its timings in one hash (``{kp}:coordinators``, field = coordinator id,
value = ``<last seen ms>|<timings>``) and refreshes the entry from its tick
loop; a process whose timings differ from a live entry's is refused at
start-up. An entry not refreshed for ``LIVE_MS`` counts as gone (a crashed
process), and a stopping process removes its own, so changing the timings
means stopping every coordinator first, then starting them with the new
values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from redis.exceptions import RedisError

from streamkit_server.core import CoordinatorConfig
from streamkit_server.store import RedisClient

__all__ = ["LIVE_MS", "TimingConflict", "Timings", "coordinators_key", "differences", "encode"]

log = logging.getLogger("streamkit_server.timings")

#: An entry this long without a refresh belongs to a process that is gone.
LIVE_MS: Final = 30_000

# Atomic, so two processes starting together cannot both miss each other.
# Uses the server's clock: coordinator hosts may disagree about the time.
_REGISTER = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local id, value = entries[i], entries[i + 1]
  local sep = string.find(value, '|', 1, true)
  local seen = sep and tonumber(string.sub(value, 1, sep - 1)) or 0
  if seen < now - tonumber(ARGV[3]) then
    redis.call('HDEL', KEYS[1], id)
  elseif id ~= ARGV[1] and string.sub(value, sep + 1) ~= ARGV[2] then
    return {0, id, string.sub(value, sep + 1)}
  end
end
redis.call('HSET', KEYS[1], ARGV[1], now .. '|' .. ARGV[2])
return {1}
"""

# (encoded name, setting) of what every process must agree on.
_FIELDS: Final = (
    ("heartbeatIntervalMs", "HEARTBEAT_INTERVAL_MS"),
    ("memberLeaseTtlMs", "MEMBER_LEASE_TTL_MS"),
    ("rebalanceTimeoutMs", "REBALANCE_TIMEOUT_MS"),
    ("producerRoutingLeaseMs", "PRODUCER_ROUTING_LEASE_MS"),
)


def coordinators_key(key_prefix: str) -> str:
    return f"{key_prefix}:coordinators"


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
        if ours.get(name) != other.get(name)
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
        self._script = self.client.register_script(_REGISTER)
        self._encoded = encode(self.config)
        self._warned_about: str | None = None

    async def register(self) -> None:
        """Add or refresh this process' entry; ``TimingConflict`` if a live one differs."""
        key = coordinators_key(self.key_prefix)
        reply = await self._script(keys=[key], args=[self.coordinator_id, self._encoded, LIVE_MS])
        if int(reply[0]) == 1:
            self._warned_about = None
            return
        other = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        theirs = reply[2].decode() if isinstance(reply[2], bytes) else str(reply[2])
        raise TimingConflict(
            f"coordinator {other} on this Redis runs with other timings "
            f"({differences(self._encoded, theirs)}); every coordinator sharing a Redis "
            "must use the same ones, because a lease one process grants is judged by "
            f"another. Give this one the same values, or stop every coordinator first to "
            f"change them (an entry of a crashed process lapses after {LIVE_MS // 1000} s)"
        )

    async def register_at_start(self) -> None:
        """``register``; a Redis that cannot take the write yet (a read-only
        replica behind the endpoint) only defers it to the tick loop's refresh."""
        try:
            await self.register()
        except (RedisError, OSError) as exc:
            log.warning("could not register this coordinator's timings yet: %s", exc)

    async def refresh(self) -> None:
        """``register`` from the tick loop: a conflict is logged (once), not raised.

        Only possible if this process' entry lapsed (it stalled for ``LIVE_MS``)
        and another process with other timings started meanwhile.
        """
        try:
            await self.register()
        except TimingConflict as exc:
            if self._warned_about != str(exc):
                self._warned_about = str(exc)
                log.error("%s", exc)

    async def unregister(self) -> None:
        await self.client.hdel(coordinators_key(self.key_prefix), self.coordinator_id)
