"""The read-only views of a :class:`~streamkit.publisher.Publisher`: tracing,
coalescing and routing counters (a mixin, to keep the publisher's module short)."""

from __future__ import annotations

from opentelemetry import trace

from streamkit.publisher.coalescer import CommandCoalescer
from streamkit.publisher.refresher import RoutingRefresher
from streamkit.publisher.router import Router
from streamkit.publisher.routing_cache import RoutingCache
from streamkit.publisher.tracing import ProducerTracing

__all__ = ["PublisherViews"]


class PublisherViews:
    """Properties over the publisher's parts (set by ``Publisher.__init__``)."""

    _tracing: ProducerTracing
    _coalescer: CommandCoalescer | None
    _router: Router

    @property
    def tracer(self) -> trace.Tracer:
        """Where spans go; by default ``trace.get_tracer("streamkit")``.

        With the default, a tracer provider installed after the publisher was
        created is noticed within one routing refresh interval.
        """
        return self._tracing.tracer

    @tracer.setter
    def tracer(self, tracer: trace.Tracer) -> None:
        self._tracing.tracer = tracer

    @property
    def trace_context_field(self) -> str | None:
        """Entry field carrying the W3C ``traceparent`` of the producer span
        (consumers link their span to it); None: not written."""
        return self._tracing.trace_context_field

    @trace_context_field.setter
    def trace_context_field(self, field: str | None) -> None:
        self._tracing.trace_context_field = field

    @property
    def coalescer(self) -> CommandCoalescer | None:
        """What turns concurrent ``publish`` calls into pipelines (None when off)."""
        return self._coalescer

    @property
    def routing_cache(self) -> RoutingCache:
        """The cache itself (read it, do not drive it): version, age, failure counters."""
        return self._router.cache

    @property
    def refresher(self) -> RoutingRefresher:
        """Refresh counters: ``started`` (requests), ``refreshes``, ``replacements``."""
        return self._router.refresher

    @property
    def stale_refreshes(self) -> int:
        """Publishes that found a stale route (or a newer version) and refreshed."""
        return self._router.stale_refreshes

    @property
    def routing_failures(self) -> int:
        """Publishes refused for lack of a usable route."""
        return self._router.routing_failures

    @property
    def metadata_version(self) -> int | None:
        table = self._router.cache.table
        return None if table is None else table.metadata_version
