"""What to say when a stream or group does not exist: the names that do.

A misspelt group is the most common first-hour mistake, and the coordinator
knows every group; so the "no such group" errors of publishers and members
list the stream's groups and name the closest one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from streamkit.coordinator_client import CoordinatorClient
from streamkit.errors import StreamkitError

__all__ = ["existing_groups_hint", "suggest"]


def suggest(stream_prefix: str, group: str, known: Iterable[tuple[str, str]]) -> str:
    """A sentence (ending in ``.`` or ``?``) naming the groups of
    ``stream_prefix`` (or of a similar stream) and the closest name; empty
    when there is nothing useful to say.

    ``known`` holds ``(stream prefix, group)`` pairs.
    """
    pairs = sorted(set(known))
    groups = [g for prefix, g in pairs if prefix == stream_prefix]
    if groups:
        text = f"stream {stream_prefix!r} has the group(s) {', '.join(map(repr, groups))}"
        close = difflib.get_close_matches(group, groups, n=1)
        return f"{text}; did you mean {close[0]!r}?" if close else f"{text}."
    streams = sorted({prefix for prefix, _ in pairs})
    close = difflib.get_close_matches(stream_prefix, streams, n=1)
    if close:
        theirs = ", ".join(repr(g) for prefix, g in pairs if prefix == close[0])
        return (
            f"there is no stream {stream_prefix!r}; did you mean {close[0]!r} (group(s) {theirs})?"
        )
    return ""


async def existing_groups_hint(client: CoordinatorClient, stream_prefix: str, group: str) -> str:
    """``suggest`` over the coordinator's groups; empty when they cannot be
    listed (the credentials may lack the READ role, which is fine)."""
    try:
        listing = await client.list_groups()
    except StreamkitError:
        return ""
    return suggest(
        stream_prefix, group, ((g.stream_prefix, g.consumer_group) for g in listing.groups)
    )
