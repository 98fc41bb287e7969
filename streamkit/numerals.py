"""Whole numbers from text that anyone may have written (query strings, settings, entries)."""

from __future__ import annotations

__all__ = ["ascii_uint"]


def ascii_uint(text: str, maximum: int | None = None) -> int | None:
    """``text`` as a non-negative integer, or None if it is not one (or above ``maximum``).

    Only ASCII digits count: ``"¹".isdigit()`` is true but ``int("¹")`` raises,
    and ``int("٣")`` is 3, neither of which a shard index or a port should be.
    """
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if maximum is None or value <= maximum else None
