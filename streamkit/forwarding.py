"""Attributes that are an attribute of one of the object's parts (a leaf module).

``stale_refreshes = Forward[int]("_router")`` in a class body reads
``self._router.stale_refreshes``: one definition for the views a class gives
of its parts, in place of a hand-written property each.

For views read now and then (counters, a hook's context), not per entry: a
plain ``property`` is faster there, as CPython specialises it.
"""

from __future__ import annotations

from typing import Generic, Never, Self, TypeVar, overload

__all__ = ["Forward", "WritableForward"]

T = TypeVar("T")


class Forward(Generic[T]):
    """A read-only attribute: ``obj.<name>`` is ``obj.<part>.<attribute>``.

    ``attribute`` defaults to the name the descriptor is assigned to; ``doc``
    is what ``help()`` shows, as a property's docstring would be.
    """

    def __init__(self, part: str, attribute: str | None = None, *, doc: str | None = None) -> None:
        self._part = part
        # Both filled in by __set_name__ when the class body is done.
        self._attribute = attribute or ""
        self._name = ""
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name
        self._attribute = self._attribute or name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Self | T:
        if obj is None:
            return self
        value: T = getattr(getattr(obj, self._part), self._attribute)
        return value

    def __set__(self, obj: object, value: Never) -> None:
        # Defined, as on a property without a setter, so that assigning fails
        # instead of hiding the view behind an instance attribute; ``Never``
        # makes the type checker refuse it too.
        raise AttributeError(f"{type(obj).__name__}.{self._name} is read-only")


class WritableForward(Forward[T]):
    """A ``Forward`` that also passes assignments through to the part."""

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self._part), self._attribute, value)
