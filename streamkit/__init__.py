"""streamkit: sharded Redis Streams with a KIP-848-style coordinator.

::

    from streamkit import Message, StreamKit

    app = StreamKit()

    @app.stream_listener(stream_prefix="orders", group="billing", concurrency=4)
    async def on_order(msg: Message) -> None:
        ...
        await msg.ack()

Run it with ``streamkit run myapp:app``.

The names below are imported lazily, so ``import streamkit.protocol`` (which
the coordinator server does) does not pull in the client runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamkit.app import StreamKit
    from streamkit.consumer.failure import FailurePolicy, PayloadError
    from streamkit.consumer.idempotence import CrossSlotEffectError, Idempotence
    from streamkit.consumer.lifecycle import ShardContext, ShardLifecycle
    from streamkit.consumer.listener import ListenerConfigError
    from streamkit.consumer.message import Message
    from streamkit.consumer.runtime import GroupNotFoundError, MemberRejectedError
    from streamkit.coordinator_client import CoordinatorError, CoordinatorUnavailable
    from streamkit.errors import StreamkitError
    from streamkit.middleware import Middleware
    from streamkit.publisher.errors import PublishError
    from streamkit.publisher.idempotence import PublishIdempotence
    from streamkit.publisher.publisher import Publisher
    from streamkit.publisher.routing_cache import RoutingUnavailable
    from streamkit.results import ConsumeResult, Outcome, PublishResult
    from streamkit.settings import StreamKitSettings

__all__ = [
    "ConsumeResult",
    "CoordinatorError",
    "CoordinatorUnavailable",
    "CrossSlotEffectError",
    "FailurePolicy",
    "GroupNotFoundError",
    "Idempotence",
    "ListenerConfigError",
    "MemberRejectedError",
    "Message",
    "Middleware",
    "Outcome",
    "PayloadError",
    "PublishError",
    "PublishIdempotence",
    "PublishResult",
    "Publisher",
    "RoutingUnavailable",
    "ShardContext",
    "ShardLifecycle",
    "StreamKit",
    "StreamKitSettings",
    "StreamkitError",
]

_EXPORTS: dict[str, str] = {
    "StreamKit": "streamkit.app",
    "GroupNotFoundError": "streamkit.consumer.runtime",
    "MemberRejectedError": "streamkit.consumer.runtime",
    "CoordinatorError": "streamkit.coordinator_client",
    "CoordinatorUnavailable": "streamkit.coordinator_client",
    "StreamkitError": "streamkit.errors",
    "FailurePolicy": "streamkit.consumer.failure",
    "PayloadError": "streamkit.consumer.failure",
    "CrossSlotEffectError": "streamkit.consumer.idempotence",
    "Idempotence": "streamkit.consumer.idempotence",
    "PublishIdempotence": "streamkit.publisher.idempotence",
    "ShardContext": "streamkit.consumer.lifecycle",
    "ShardLifecycle": "streamkit.consumer.lifecycle",
    "ListenerConfigError": "streamkit.consumer.listener",
    "Message": "streamkit.consumer.message",
    "ConsumeResult": "streamkit.results",
    "Middleware": "streamkit.middleware",
    "Outcome": "streamkit.results",
    "PublishError": "streamkit.publisher.errors",
    "PublishResult": "streamkit.results",
    "Publisher": "streamkit.publisher.publisher",
    "RoutingUnavailable": "streamkit.publisher.routing_cache",
    "StreamKitSettings": "streamkit.settings",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'streamkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
