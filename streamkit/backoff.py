"""The one jittered exponential backoff of the client.

Used by the heartbeat loop (coordinator down), the poller (Redis down) and the
failure policy (a handler failed).  Pure: the caller passes the random draw,
so tests can pin it.
"""

from __future__ import annotations

#: Beyond this many doublings every ceiling is the cap anyway; the bound keeps
#: the power from growing without end (an overflow for an int multiplier).
_MAX_EXPONENT = 64


def jittered_backoff(
    attempt: int,
    initial: float,
    maximum: float,
    rand: float,
    *,
    multiplier: float = 2.0,
    jitter: float = 0.5,
) -> float:
    """The delay after failed attempt ``attempt`` (1-based).

    The ceiling ``min(maximum, initial * multiplier ** (attempt - 1))`` loses a
    random part, ``jitter * rand`` of it (``rand`` in [0, 1)), so that many
    clients failing together do not retry in lockstep.  With the default
    jitter of one half the delay lies in ``(ceiling / 2, ceiling]``.
    """
    exponent = min(max(attempt - 1, 0), _MAX_EXPONENT)
    ceiling = min(float(maximum), initial * multiplier**exponent)
    return ceiling * (1 - jitter * rand)
