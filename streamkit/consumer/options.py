"""How the built-in poller reads (``PollerOptions``) and who watches it read
(``ReadObserver``): shared by the poller and each of its shard readers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from streamkit.consumer.failure import FailurePolicy
from streamkit.consumer.idempotence import Idempotence

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_BLOCK_MS",
    "IN_FLIGHT_BATCHES",
    "PollerOptions",
    "ReadObserver",
]

#: Entries per read, unless the listener says otherwise.
DEFAULT_BATCH_SIZE: Final = 100
#: Longest BLOCK of an idle read, in ms.
DEFAULT_BLOCK_MS: Final = 2_000
#: Default in-flight budget of a member, in batches.
IN_FLIGHT_BATCHES: Final = 4

_DEFAULT_POLICY = FailurePolicy()


@dataclass(frozen=True, slots=True)
class PollerOptions:
    batch_size: int = DEFAULT_BATCH_SIZE
    #: Entries read but not yet handled, per member (the heartbeat reports it
    #: as runtimeMaxConcurrency).
    max_in_flight: int = IN_FLIGHT_BATCHES * DEFAULT_BATCH_SIZE
    #: Longest BLOCK of an idle read; the lease may cut it shorter.
    block_ms: int = DEFAULT_BLOCK_MS
    #: Handle a shard's entries one after another, in stream order.  False:
    #: a batch's handlers run concurrently.
    ordered: bool = True
    #: Ack after the handler returns without raising (unless it settled the
    #: message itself).
    auto_ack: bool = False
    #: Claim the group's pending entries when a shard is assigned.
    claim_pending: bool = True
    #: The handler takes a list of up to ``batch_size`` entries of one shard.
    batch: bool = False
    #: What to do with a failed entry.
    policy: FailurePolicy = _DEFAULT_POLICY
    #: Idempotent listener: markers, fencing, staged effects (None: off).
    idempotence: Idempotence | None = None


class ReadObserver(Protocol):
    """Sees every read a poller issues (metrics, tracing, tests).

    ``read_started`` is called right before a read command is sent and
    ``read_finished`` once it returned, failed or was cancelled, so the pair
    brackets the whole time the read can be executing in Redis.
    """

    def read_started(self, shard: int, member_id: str, epoch: int) -> None: ...

    def read_finished(self, shard: int, member_id: str, epoch: int, count: int) -> None: ...
