"""What a publish and a handled entry come to: results and outcomes.

A leaf: at run time it imports nothing of streamkit, so the publisher, the
poller and the middlewares can all name these types without importing each
other (``Message`` is named for type checkers only).

* :class:`PublishResult`: where a published message was appended.
* :class:`Decision` / :class:`Action`: the failure policy's verdict on a
  failed entry (``streamkit.consumer.failure`` decides, the poller carries it out).
* :class:`ConsumeResult` / :class:`Outcome`: what became of one handled entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamkit.consumer.message import Message

__all__ = ["Action", "ConsumeResult", "Decision", "Outcome", "PublishResult"]


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Where a message was appended."""

    stream_key: str
    shard_index: int
    record_id: str
    #: Routing metadata version the message was routed with.
    metadata_version: int
    #: An idempotent publish whose id the shard had seen: nothing was
    #: appended, ``record_id`` is the first append's entry id.
    deduplicated: bool = False


class Action(Enum):
    RETRY = "retry"
    DEAD_LETTER = "dead_letter"
    HALT = "halt"


@dataclass(frozen=True, slots=True)
class Decision:
    """The failure policy's verdict on a failed delivery."""

    action: Action
    #: RETRY: how long to wait before the next delivery.
    delay_ms: int = 0
    #: What went wrong, bounded (``x-error`` of a dead letter, log lines).
    error: str = ""


class Outcome(Enum):
    """What became of a handled entry (the failure policy's decision)."""

    ACKED = "acked"  # the handler finished (acked, or settled by itself)
    RETRIED = "retried"
    DEAD_LETTERED = "dead_lettered"
    HALTED = "halted"


_OUTCOMES = {
    Action.RETRY: Outcome.RETRIED,
    Action.DEAD_LETTER: Outcome.DEAD_LETTERED,
    Action.HALT: Outcome.HALTED,
}


# Not frozen: the poller makes one per handled entry, and a frozen
# dataclass' __init__ (object.__setattr__ per field) costs several times as much.
@dataclass(slots=True)
class ConsumeResult:
    """The outcome of one entry (read-only by convention).

    ``decision`` is None when the entry is done; else the failure policy's
    decision, which the poller carries out after the chain returned (a
    dead-letter write that fails leaves the entry pending and it comes back).
    ``error`` is the handler's exception (None for success or a ``nack``).
    ``message`` is the entry (set by the poller; None in a result a
    middleware makes up).
    """

    decision: Decision | None = None
    error: BaseException | None = None
    duration_s: float = 0.0
    message: Message | None = None

    @property
    def outcome(self) -> Outcome:
        return Outcome.ACKED if self.decision is None else _OUTCOMES[self.decision.action]

    @property
    def failed(self) -> bool:
        """The handler raised or nacked."""
        return self.decision is not None
