"""Exception hierarchy shared by the streamkit client library."""

from __future__ import annotations


class StreamkitError(Exception):
    """Base class for every error streamkit raises on purpose.

    Callers can catch this one type to separate streamkit's own, documented
    failures from bugs and from errors raised by Redis or HTTP clients.
    """
