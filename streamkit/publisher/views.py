"""The read-only views of a :class:`~streamkit.publisher.Publisher`: tracing,
coalescing and routing counters (a mixin, to keep the publisher's module short)."""

from __future__ import annotations

from opentelemetry import trace

from streamkit.forwarding import Forward, WritableForward
from streamkit.publisher.coalescer import CommandCoalescer
from streamkit.publisher.refresher import RoutingRefresher
from streamkit.publisher.router import Router
from streamkit.publisher.routing_cache import RoutingCache
from streamkit.publisher.tracing import ProducerTracing

__all__ = ["PublisherViews"]


class PublisherViews:
    """Views of the publisher's parts (set by ``Publisher.__init__``)."""

    _tracing: ProducerTracing
    _coalescer: CommandCoalescer | None
    _router: Router

    tracer = WritableForward[trace.Tracer](
        "_tracing",
        doc="""Where spans go; by default ``trace.get_tracer("streamkit")``.

        With the default, a tracer provider installed after the publisher was
        created is noticed within one routing refresh interval.
        """,
    )
    trace_context_field = WritableForward[str | None](
        "_tracing",
        doc="""Entry field carrying the W3C ``traceparent`` of the producer span
        (consumers link their span to it); None: not written.""",
    )

    @property
    def coalescer(self) -> CommandCoalescer | None:
        """What turns concurrent ``publish`` calls into pipelines (None when off)."""
        return self._coalescer

    routing_cache = Forward[RoutingCache](
        "_router",
        "cache",
        doc="The cache itself (read it, do not drive it): version, age, failure counters.",
    )
    refresher = Forward[RoutingRefresher](
        "_router", doc="Refresh counters: ``started`` (requests), ``refreshes``, ``replacements``."
    )
    stale_refreshes = Forward[int](
        "_router", doc="Publishes that found a stale route (or a newer version) and refreshed."
    )
    routing_failures = Forward[int]("_router", doc="Publishes refused for lack of a usable route.")

    @property
    def metadata_version(self) -> int | None:
        table = self._router.cache.table
        return None if table is None else table.metadata_version
