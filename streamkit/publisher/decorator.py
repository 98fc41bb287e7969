"""``publish_result``: a handler whose return value is also published."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ParamSpec, Protocol, TypeVar

from streamkit.publisher.encoding import PAYLOAD_FIELD, Fields, PartitionKey
from streamkit.results import PublishResult

__all__ = ["Publishes", "publish_result"]

P = ParamSpec("P")
R = TypeVar("R")


class Publishes(Protocol):
    """What ``publish_result`` publishes through (a ``Publisher``)."""

    async def publish(self, partition_key: PartitionKey, fields: Fields) -> PublishResult: ...

    async def publish_json(
        self, partition_key: PartitionKey, obj: Any, field: str = PAYLOAD_FIELD
    ) -> PublishResult: ...


def publish_result(
    publisher: Publishes,
    key: Callable[[R], PartitionKey],
    *,
    field: str = PAYLOAD_FIELD,
    as_fields: bool = False,
) -> Callable[[Callable[P, Awaitable[R | None]]], Callable[P, Awaitable[R | None]]]:
    """Decorate an async handler so that its return value is also published.

    ``key(result)`` gives the partition key. The result is published as JSON in
    ``field`` (see :meth:`Publisher.publish_json`), or, with ``as_fields=True``,
    as the entry's fields (it must then be a mapping). ``None`` publishes
    nothing. The result is returned unchanged, after it was published; if
    publishing fails the handler call fails (and is retried by its caller).
    """

    def decorate(handler: Callable[P, Awaitable[R | None]]) -> Callable[P, Awaitable[R | None]]:
        @functools.wraps(handler)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            result = await handler(*args, **kwargs)
            if result is None:
                return None
            if as_fields:
                if not isinstance(result, Mapping):
                    raise TypeError(
                        f"{handler.__qualname__} returned {type(result).__name__}, "
                        "not a mapping of fields"
                    )
                await publisher.publish(key(result), result)
            else:
                await publisher.publish_json(key(result), result, field)
            return result

        return wrapper

    return decorate
