"""Which streams and groups a principal may name: its scope.

A principal configured with ``streams`` and/or ``groups`` patterns (shell-style,
``fnmatch``: ``*``, ``?``, ``[...]``, matched case-sensitively) may only call
routes whose ``streamPrefix``/``consumerGroup`` they match:

* ``streams``: patterns on the stream prefix, e.g. ``["orders", "orders-*"]``;
* ``groups``: patterns on ``<streamPrefix>/<consumerGroup>``, e.g.
  ``["orders/*", "payments/billing"]``; a pattern without ``/`` applies to the
  group name of any stream.  (``/`` is in no valid name, so the two parts
  cannot be confused.)  A route naming only a stream matches a ``groups``
  pattern when the stream part does.

No patterns means every stream and group: today's behaviour.  Tokens carry the
scope they were issued with, and the principal's current settings apply too:
a request must satisfy both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

__all__ = ["UNLIMITED", "Scope", "parse_patterns"]


@dataclass(frozen=True, slots=True)
class Scope:
    streams: tuple[str, ...] | None = None
    groups: tuple[str, ...] | None = None

    @property
    def unlimited(self) -> bool:
        return self.streams is None and self.groups is None

    def allows(self, stream_prefix: str, consumer_group: str | None = None) -> bool:
        if self.streams is not None and not any(
            fnmatchcase(stream_prefix, p) for p in self.streams
        ):
            return False
        if self.groups is None:
            return True
        for pattern in self.groups:
            stream_part, sep, group_part = pattern.rpartition("/")
            if not sep:
                stream_part = "*"
            if not fnmatchcase(stream_prefix, stream_part):
                continue
            if consumer_group is None or fnmatchcase(consumer_group, group_part):
                return True
        return False

    def claims(self) -> dict[str, list[str]]:
        """The token claims that carry this scope (none when unlimited)."""
        out: dict[str, list[str]] = {}
        if self.streams is not None:
            out["streams"] = list(self.streams)
        if self.groups is not None:
            out["groups"] = list(self.groups)
        return out

    @classmethod
    def from_claims(cls, claims: dict[str, Any]) -> Scope:
        return cls(
            parse_patterns(claims.get("streams"), "streams"),
            parse_patterns(claims.get("groups"), "groups"),
        )


def parse_patterns(raw: object, what: str) -> tuple[str, ...] | None:
    """A list of non-empty pattern strings (None: absent); ValueError otherwise."""
    if raw is None:
        return None
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ValueError(f"{what} must be a list of patterns")
    if not all(isinstance(p, str) and p.strip() for p in raw):
        raise ValueError(f"{what} patterns must be non-empty strings")
    return tuple(raw)


#: Every stream and group (no patterns configured).
UNLIMITED = Scope()
