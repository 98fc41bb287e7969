"""An exception that reached ``main`` -> one ``error:`` line and an exit status.

Everything streamkit raises on purpose already says what is wrong and which
setting or flag fixes it; so do the start-up failures of the libraries below
it once described here.  Anything else is a bug (ours or the app's), shown as
one line too, with the way to see its traceback.
"""

from __future__ import annotations

import sys

from streamkit.cli.common import EXIT_FAILED, EXIT_USAGE
from streamkit.errors import StreamkitError, first_leaf

__all__ = ["describe"]

_DEBUG_HINT = "STREAMKIT_DEBUG=1 (or streamkit -v) shows the traceback"


def describe(exc: BaseException) -> tuple[str, int]:
    """``(message, exit status)`` for ``exc``."""
    if isinstance(exc, BaseExceptionGroup):
        leaf = first_leaf(exc, StreamkitError)
        if leaf is not None:
            return describe(leaf)
    if isinstance(exc, StreamkitError):
        return str(exc), EXIT_USAGE
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", 130
    redis_error = _redis_error(exc)
    if redis_error is not None:
        return redis_error, EXIT_USAGE
    return f"unexpected {type(exc).__name__}: {exc} ({_DEBUG_HINT})", EXIT_FAILED


def _redis_error(exc: BaseException) -> str | None:
    """A redis-py failure no command turned into its own error (a connection
    that broke mid-command): name the setting, never the password."""
    if "redis" not in sys.modules:  # nothing used Redis: it cannot be its error
        return None
    from redis.exceptions import AuthenticationError, RedisError

    if isinstance(exc, AuthenticationError):
        return f"Redis refused the credentials ({exc}); STREAMKIT_REDIS_URL carries them"
    if isinstance(exc, RedisError):
        return f"Redis: {type(exc).__name__}: {exc} (STREAMKIT_REDIS_URL sets the address)"
    return None
