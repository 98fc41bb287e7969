"""What happens to an entry whose handler failed: the failure policy.

Pure decisions, no I/O: given the attempt (Redis' delivery counter of the
entry), the error (or a ``nack``) and the policy, ``decide`` answers *retry
after X ms*, *dead-letter* or *halt the shard*.  The poller does the Redis
side (``XCLAIM`` for a retry, ``XADD`` to the dead-letter stream plus
``XACK``), so a later middleware layer can wrap the one call that turns a
handler outcome into a ``Decision``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from streamkit.backoff import jittered_backoff
from streamkit.errors import StreamkitError
from streamkit.results import Action, Decision

if TYPE_CHECKING:
    from streamkit.settings import StreamKitSettings

__all__ = [
    "Action",
    "Decision",
    "FailurePolicy",
    "PayloadError",
    "dead_letter_fields",
    "dead_letter_key",
    "describe_error",
    "legacy_dead_letter_key",
]

#: Fields streamkit adds to a dead-lettered entry (the original fields are kept).
X_ORIGINAL_STREAM: Final = "x-original-stream"
X_ORIGINAL_ID: Final = "x-original-id"
X_GROUP: Final = "x-group"
X_ATTEMPTS: Final = "x-attempts"
X_ERROR: Final = "x-error"
X_FAILED_AT: Final = "x-failed-at"
DEAD_LETTER_FIELDS: Final = (
    X_ORIGINAL_STREAM,
    X_ORIGINAL_ID,
    X_GROUP,
    X_ATTEMPTS,
    X_ERROR,
    X_FAILED_AT,
)
#: Names a later release may add to a dead letter (a format version, say):
#: this release already keeps them out of a replayed entry, so a dead letter
#: written by the next release is replayed here without them (N/N-1).
RESERVED_PREFIX: Final = "x-streamkit-"
NACKED: Final = "nacked by the handler"


def is_metadata(name: str) -> bool:
    """Whether a dead letter's field is streamkit's metadata, not the entry's own."""
    return name in DEAD_LETTER_FIELDS or name.startswith(RESERVED_PREFIX)


class PayloadError(StreamkitError, ValueError):
    """An entry's payload could not be decoded into the handler's model.

    Retrying cannot fix it, so the default policy dead-letters it at once.
    """


OnExhausted = Literal["dead_letter", "halt"]


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    """Retries in place, then a dead letter (or a halted shard).

    ``max_attempts`` counts deliveries (Redis' delivery counter), so it goes on
    across handoffs and restarts.  The delay before attempt ``n + 1`` is
    ``min(backoff_max_ms, backoff_initial_ms * backoff_multiplier ** (n - 1))``,
    of which a random part (``jitter``, 0..1) is taken off so that many failing
    entries do not retry in lockstep.  Errors that are instances of
    ``no_retry`` or for which ``no_retry_if(error)`` is true skip the retries.
    After the last attempt ``on_exhausted`` decides: ``"dead_letter"`` writes
    the entry to the dead-letter stream and acks it, ``"halt"`` keeps it pending
    and stops reading its shard.
    """

    max_attempts: int = 5
    backoff_initial_ms: int = 200
    backoff_max_ms: int = 30_000
    backoff_multiplier: float = 2.0
    jitter: float = 0.5
    on_exhausted: OnExhausted = "dead_letter"
    no_retry: tuple[type[BaseException], ...] = (PayloadError,)
    no_retry_if: Callable[[BaseException], bool] | None = None
    #: Dead-letter stream key; None: ``{stream_prefix}/dlq/{group}``.
    dead_letter_stream: str | None = None
    #: ``MAXLEN ~`` of the dead-letter stream.
    dead_letter_maxlen: int = 100_000
    #: Longest ``x-error`` (exception type and message), in characters.
    error_limit: int = 1_000

    def __post_init__(self) -> None:
        for name in ("max_attempts", "dead_letter_maxlen", "error_limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.backoff_initial_ms < 0 or self.backoff_max_ms < self.backoff_initial_ms:
            raise ValueError("need 0 <= backoff_initial_ms <= backoff_max_ms")
        if self.backoff_multiplier < 1:
            raise ValueError("backoff_multiplier must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be between 0 and 1")
        if self.on_exhausted not in ("dead_letter", "halt"):
            raise ValueError("on_exhausted must be 'dead_letter' or 'halt'")

    @classmethod
    def from_settings(cls, settings: StreamKitSettings) -> FailurePolicy:
        """The app-wide default (``STREAMKIT_RETRY_*`` / ``STREAMKIT_DEAD_LETTER_*``)."""
        return cls(
            max_attempts=settings.retry_max_attempts,
            backoff_initial_ms=settings.retry_backoff_ms,
            backoff_max_ms=settings.retry_backoff_max_ms,
            dead_letter_maxlen=settings.dead_letter_maxlen,
        )

    def retryable(self, error: BaseException | None) -> bool:
        if error is None:
            return True  # a nack asks for a redelivery
        if isinstance(error, self.no_retry):
            return False
        return not (self.no_retry_if is not None and self.no_retry_if(error))

    def backoff_ms(self, attempt: int, rand: float) -> int:
        """Delay after failed attempt ``attempt`` (1-based); ``rand`` in [0, 1)."""
        delay = jittered_backoff(
            attempt,
            self.backoff_initial_ms,
            self.backoff_max_ms,
            rand,
            multiplier=self.backoff_multiplier,
            jitter=self.jitter,
        )
        return int(delay)

    def decide(
        self,
        attempt: int,
        error: BaseException | None,
        *,
        delay_ms: int | None = None,
        rand: float = 0.0,
    ) -> Decision:
        """The next step for an entry whose delivery ``attempt`` failed.

        ``error`` is None for a ``nack``; ``delay_ms`` is the delay a nack asked
        for (None: the policy's backoff).
        """
        text = NACKED if error is None else describe_error(error, self.error_limit)
        if attempt < self.max_attempts and self.retryable(error):
            delay = self.backoff_ms(attempt, rand) if delay_ms is None else max(0, delay_ms)
            return Decision(Action.RETRY, delay, text)
        if self.on_exhausted == "halt":
            return Decision(Action.HALT, 0, text)
        return Decision(Action.DEAD_LETTER, 0, text)

    def dead_letter_key(self, stream_prefix: str, consumer_group: str) -> str:
        return self.dead_letter_stream or dead_letter_key(stream_prefix, consumer_group)


def dead_letter_key(stream_prefix: str, consumer_group: str) -> str:
    """The default dead-letter stream of a group: ``{stream_prefix}/dlq/{group}``.

    ``/`` is the one character valid stream and group names never contain, so a
    dead-letter key can never be a shard key (``{prefix}:{n}``), another group's
    dead-letter key, or a coordinator key (``{keyPrefix}:…``).  Before 0.2 the key was
    ``{prefix}:dlq:{group}``: group ``0`` of ``col`` then wrote into shard 0 of
    a stream named ``col:dlq`` (``legacy_dead_letter_key``; the coordinator moves
    such streams at start, see docs/operations.md).
    """
    return f"{stream_prefix}/dlq/{consumer_group}"


def legacy_dead_letter_key(stream_prefix: str, consumer_group: str) -> str:
    """The dead-letter key of earlier releases (it could collide with a shard key)."""
    return f"{stream_prefix}:dlq:{consumer_group}"


def describe_error(error: BaseException, limit: int) -> str:
    """``Type: message``, cut to ``limit`` characters (an ellipsis marks the cut)."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def dead_letter_fields(
    raw_fields: Mapping[bytes, bytes],
    *,
    stream_key: str,
    entry_id: str,
    consumer_group: str,
    attempts: int,
    error: str,
    failed_at_ms: int | None = None,
) -> dict[Any, Any]:
    """The dead-letter entry: the original fields plus the ``x-*`` metadata.

    An entry that was dead-lettered before and replayed gets fresh metadata
    (the old ``x-*`` fields are replaced, not repeated).
    """
    out: dict[Any, Any] = {k: v for k, v in raw_fields.items() if not is_metadata(_text(k))}
    when = int(time.time() * 1000) if failed_at_ms is None else failed_at_ms
    out[X_ORIGINAL_STREAM] = stream_key
    out[X_ORIGINAL_ID] = entry_id
    out[X_GROUP] = consumer_group
    out[X_ATTEMPTS] = str(attempts)
    out[X_ERROR] = error
    out[X_FAILED_AT] = str(when)
    return out


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
