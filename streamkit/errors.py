"""Exception hierarchy shared by the streamkit client library."""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class StreamkitError(Exception):
    """Base class for every error streamkit raises on purpose.

    Callers can catch this one type to separate streamkit's own, documented
    failures from bugs and from errors raised by Redis or HTTP clients.
    """


def first_leaf(group: BaseExceptionGroup[BaseException], kind: type[E]) -> E | None:
    """The first exception of type ``kind`` in ``group``, nested groups searched through.

    Task groups wrap what their tasks raise; the caller wants to re-raise a
    ``GroupNotFoundError`` as itself, not a traceback of the group around it.
    """
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found = first_leaf(exc, kind)
            if found is not None:
                return found
        elif isinstance(exc, kind):
            return exc
    return None
