"""The publisher's own errors (all :class:`PublishError`, a ``StreamkitError``).

``RoutingUnavailable`` (no trusted routing: fail closed) belongs to the
routing cache and is re-exported here, next to the others a publish raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from streamkit.errors import StreamkitError
from streamkit.publisher.routing_cache import RoutingUnavailable
from streamkit.results import PublishResult

__all__ = [
    "CoordinatorUnreachableError",
    "PublishBatchError",
    "PublishError",
    "PublisherClosedError",
    "PublisherStartupError",
    "RoutingUnavailable",
    "ShardStreamsMissing",
    "StaleRouteError",
    "UnknownGroupError",
]


class PublishError(StreamkitError):
    """Base class of the publisher's own errors."""


class PublisherClosedError(PublishError):
    """``publish`` after ``aclose()``."""


class PublisherStartupError(PublishError):
    """The publisher could not get usable routing for its stream and group."""

    def __init__(self, message: str, stream_prefix: str, consumer_group: str) -> None:
        super().__init__(message)
        self.stream_prefix = stream_prefix
        self.consumer_group = consumer_group


class CoordinatorUnreachableError(PublisherStartupError):
    """The coordinator could not be reached for the first routing (its message
    names the address and ``STREAMKIT_COORDINATOR_URL``)."""


class UnknownGroupError(PublisherStartupError):
    """The coordinator has no such group (404): it was never created, or deleted."""


class ShardStreamsMissing(PublisherStartupError):
    """Routed shard keys that are not streams in Redis (missing or another type)."""

    def __init__(
        self, message: str, stream_prefix: str, consumer_group: str, found: Mapping[str, str]
    ) -> None:
        super().__init__(message, stream_prefix, consumer_group)
        #: shard key -> what Redis has there (``"none"`` when the key is missing).
        self.found = dict(found)


class StaleRouteError(PublishError):
    """The routed shard stream does not exist and fresh routing still points to it."""

    def __init__(self, message: str, stream_key: str, shard_index: int, version: int) -> None:
        super().__init__(message)
        self.stream_key = stream_key
        self.shard_index = shard_index
        self.metadata_version = version


class PublishBatchError(PublishError):
    """``publish_many`` published some messages but not all.

    When nothing at all was published, the error itself is raised instead.
    """

    def __init__(
        self, results: Sequence[PublishResult | None], errors: Mapping[int, BaseException]
    ) -> None:
        first = min(errors)
        super().__init__(
            f"{len(errors)} of {len(results)} messages were not published "
            f"(first: #{first}: {errors[first]!r})"
        )
        #: In input order; None where the message was not published.
        self.results = list(results)
        #: Input index -> why that message was not published.
        self.errors = dict(errors)
