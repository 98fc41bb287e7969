"""What ``StreamKit.serve()`` checks before any member joins.

Each check turns a misconfiguration into one clear error at once (an
unreachable Redis, an unknown group) instead of members that join and then
fail, or take shards they cannot read.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable

import anyio
from redis.exceptions import RedisError

from streamkit.connections import AsyncRedis, redacted_url
from streamkit.consumer.listener import Listener
from streamkit.consumer.poller import supports_xackdel
from streamkit.consumer.runtime import GroupNotFoundError
from streamkit.coordinator_client import CoordinatorClient, CoordinatorError, CoordinatorUnavailable
from streamkit.errors import StreamkitError
from streamkit.group_hints import existing_groups_hint
from streamkit.redis_health import describe_error
from streamkit.settings import StreamKitSettings

__all__ = [
    "RedisUnreachableError",
    "check_groups",
    "check_redis",
    "detect_xackdel",
    "freeze_startup_heap",
    "redis_unreachable_message",
]

log = logging.getLogger("streamkit.app")

#: How long the start-up PING may take before Redis counts as unreachable.
REDIS_CHECK_S = 5.0


class RedisUnreachableError(StreamkitError):
    """Redis did not answer when the app (or a command) started."""


def redis_unreachable_message(settings: StreamKitSettings, exc: BaseException) -> str:
    """One line naming the address (password hidden), the error and the setting."""
    return (
        f"cannot reach Redis at {redacted_url(settings.redis_url)}"
        + (" (cluster)" if settings.redis_cluster else "")
        + f": {describe_error(exc).rstrip('.')}; is redis-server running there? "
        "STREAMKIT_REDIS_URL sets the address"
    )


async def check_redis(redis: AsyncRedis, settings: StreamKitSettings) -> None:
    """Fail at once when Redis does not answer: members that joined now
    would take shards they cannot read away from members that can."""
    try:
        with anyio.fail_after(REDIS_CHECK_S):
            await redis.ping()
    except (RedisError, OSError, TimeoutError) as exc:
        raise RedisUnreachableError(redis_unreachable_message(settings, exc)) from None


async def check_groups(
    coordinator: CoordinatorClient,
    listeners: Iterable[Listener],
    coordinator_url: str,
    *,
    credentials: bool = False,
) -> None:
    """Fail at once for a group the coordinator does not know, or for
    ``credentials`` (a configured user or token) it refuses."""
    for listener in listeners:
        prefix, group = listener.key
        try:
            await coordinator.get_group(prefix, group)
        except CoordinatorError as exc:
            if exc.status_code == 404:
                hint = await existing_groups_hint(coordinator, prefix, group)
                raise GroupNotFoundError(prefix, group, coordinator_url, hint) from None
            if exc.status_code in (401, 429) and credentials:
                # Refused credentials: every heartbeat would be refused too
                # (and count as one more failed login).
                raise
            if exc.status_code == 401:
                # No credentials: fine for a coordinator whose member API is
                # open (--insecure-member-api); else the first heartbeat tells.
                log.warning("%s", exc)
                continue
            # Without the READ role the first heartbeat does the check
            # (a 404 before the first answer is fatal there too).
            log.debug("cannot look up %s/%s before joining: %s", prefix, group, exc)
        except CoordinatorUnavailable as exc:
            log.warning("%s; members keep retrying", exc)
            return


async def detect_xackdel(redis: AsyncRedis, settings: StreamKitSettings) -> bool:
    try:
        native = await supports_xackdel(redis)
    except Exception as exc:  # Redis went away since the check: readers retry anyway
        log.warning(
            "could not ask Redis at %s whether it has XACKDEL (%s); using XACK+XDEL",
            redacted_url(settings.redis_url),
            describe_error(exc),
        )
        return False
    log.debug("ack_del uses %s", "XACKDEL" if native else "MULTI XACK+XDEL")
    return native


def freeze_startup_heap() -> None:
    """Collect once, then keep every object alive now out of later collections.

    The objects alive once an app started (modules, clients, the container)
    live as long as the process; rescanning them is what makes a full
    collection slow (about 0.3 us per object: 30-60 ms for a typical app).
    The collection first frees start-up garbage, which freezing would keep.
    """
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.debug(
        "froze %d objects out of garbage collection in %.0f ms",
        gc.get_freeze_count(),
        (time.perf_counter() - started) * 1000,
    )
