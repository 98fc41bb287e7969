"""One pass of a background task (the tick loop, the retention janitor)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

__all__ = ["guarded_pass"]


async def guarded_pass(
    log: logging.Logger,
    what: str,
    pass_once: Callable[[], Awaitable[object]],
    *,
    stop_on: tuple[type[Exception], ...] = (),
) -> str | None:
    """Run ``pass_once``: the error health shows for it, None if it worked.

    A Redis or network error is a warning (the next pass tries again).  Any
    other exception is a bug, logged with its traceback, and must not stop the
    task for good either.  ``stop_on`` errors are the caller's to handle.
    """
    try:
        await pass_once()
    except stop_on:
        raise
    except (RedisError, OSError) as exc:
        log.warning("%s pass failed: %s", what, exc)
        return str(exc)
    except Exception as exc:
        log.exception("%s pass failed unexpectedly", what)
        return f"{type(exc).__name__}: {exc}"
    return None
