"""What ``getCoordinatorHealth`` answers, decided from plain observations.

Pure: the runtime gathers the facts (a timed Redis PING, the gate, the tick
loop's last pass) and this module turns them into UP / DEGRADED / DOWN with
one human-readable reason per problem, so the rules are tested without a
server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamkit.protocol import HealthStatus

__all__ = ["SLOW_REDIS_S", "HealthFacts", "HealthVerdict", "assess", "lag_limit_s"]

# A PING slower than this already delays every heartbeat noticeably.
SLOW_REDIS_S = 0.25


def lag_limit_s(interval_s: float) -> float:
    """How far behind the tick loop may run before health says DEGRADED.

    A few intervals: one slow pass (a Redis hiccup) is normal; several mean
    lease expiry and fencing are applied late.
    """
    return max(2.0, 5 * interval_s)


@dataclass(frozen=True, slots=True)
class HealthFacts:
    #: PING round trip in seconds, or None when it failed.
    redis_rtt_s: float | None
    #: Why the PING failed (exception type and message); None when it answered.
    redis_error: str | None
    terminating: bool
    loop_running: bool
    #: Seconds the tick loop's last pass is overdue (its age minus one interval).
    tick_lag_s: float | None
    tick_interval_s: float
    tick_error: str | None
    #: Groups the last tick pass could not read (unknown schema/layout, corrupt).
    unreadable_groups: Sequence[str] = ()
    #: Why the process decides nothing for now (another live coordinator runs
    #: with other timings: see timings.py); None when it serves.
    suspended: str | None = None


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    status: HealthStatus
    redis: str
    loop: str
    reasons: tuple[str, ...]


def assess(facts: HealthFacts) -> HealthVerdict:
    reasons: list[str] = []
    down = False
    if facts.redis_rtt_s is None:
        down = True
        redis = f"DOWN ({facts.redis_error})"
        reasons.append(f"Redis unreachable: {facts.redis_error}")
    elif facts.redis_rtt_s > SLOW_REDIS_S:
        redis = f"SLOW ({facts.redis_rtt_s * 1000:.0f} ms)"
        reasons.append(f"Redis slow: PING took {facts.redis_rtt_s * 1000:.0f} ms")
    else:
        redis = f"UP ({facts.redis_rtt_s * 1000:.1f} ms)"
    if facts.suspended is not None:
        # Down, not degraded: it answers nothing a member or admin asks for.
        down = True
        loop = "SUSPENDED"
        reasons.append(f"suspended: {facts.suspended}")
    elif facts.terminating:
        loop = "TERMINATING"
        reasons.append("terminating: new heartbeats and admin mutations are refused")
    elif not facts.loop_running:
        loop = "STOPPED"
        reasons.append("tick loop stopped: leases and rebalance timeouts are not applied")
    elif facts.tick_lag_s is not None and facts.tick_lag_s > lag_limit_s(facts.tick_interval_s):
        loop = f"LAGGING ({facts.tick_lag_s:.1f} s behind)"
        reasons.append(
            f"tick loop {facts.tick_lag_s:.1f} s behind its {facts.tick_interval_s:g} s interval"
        )
    elif facts.tick_error:
        # Not a degradation by itself: the next pass retries (a Redis blip).
        loop = f"FAILING ({facts.tick_error})"
    else:
        loop = "UP"
    if facts.unreadable_groups:
        shown = ", ".join(sorted(facts.unreadable_groups)[:5])
        more = len(facts.unreadable_groups) - 5
        reasons.append(
            f"{len(facts.unreadable_groups)} group(s) with metadata this coordinator cannot "
            f"use (unknown schema/layout version or corrupt): {shown}"
            + (f" and {more} more" if more > 0 else "")
        )
    if down:
        status = HealthStatus.DOWN
    elif reasons:
        status = HealthStatus.DEGRADED
    else:
        status = HealthStatus.UP
    return HealthVerdict(status, redis, loop, tuple(reasons))
