"""Where a local run (``streamkit demo``, ``streamkit dev``) gets Redis and the coordinator."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LocalServices"]


@dataclass(frozen=True)
class LocalServices:
    """The ``--redis-url``, ``--redis-cluster`` and ``--port`` of a local run."""

    #: An existing Redis; None starts a private ``redis-server``.
    redis_url: str | None = None
    #: ``redis_url`` is a cluster node.
    redis_cluster: bool = False
    #: Fixed coordinator port (None: a free one), e.g. to bookmark the console.
    port: int | None = None
