"""Durations as people type and read them (``"7d"``, ``"12h"``, ``"500ms"``).

One owner for the units: the admin CLI parses them (``stream retention
--max-age``) and both the CLI and the coordinator's retention reasons print
them, so a duration reads the same on either side.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["DURATION_UNITS", "format_duration", "parse_duration"]

#: Milliseconds per unit.
DURATION_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
                         "w": 604_800_000}  # fmt: skip
_DURATION: Final = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration(text: str) -> int:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"500ms"`` or plain ms -> milliseconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (e.g. 7d, 12h, 30m, 45s, 500ms)")
    return int(match.group(1)) * DURATION_UNITS[match.group(2) or "ms"]


def format_duration(ms: int) -> str:
    """The largest whole unit: 604800000 -> ``"7d"``, 90000 -> ``"90s"``."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % DURATION_UNITS[unit] == 0:
            return f"{ms // DURATION_UNITS[unit]}{unit}"
    return f"{ms}ms"
