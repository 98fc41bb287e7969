"""``@publisher``: a function whose return value is published, by partition key.

``app.publisher("invoices", group="billing", key=lambda inv: inv.customer_id)``
gives a :class:`~streamkit.publisher.publisher.Publisher` that is also a
decorator. Stacked on a listener, the handler's return value (a model, a
dict, a list of them; ``None`` for nothing) is published *inside* the handler
call, after the handler returned: the listener acks the entry only after that
call returned, so a crash between the two repeats the publish (at-least-once)
instead of losing it. ``publish_result`` is the older, deprecated spelling.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ParamSpec, Protocol, TypeVar

from streamkit.publisher.encoding import PAYLOAD_FIELD, Fields, PartitionKey, json_payload
from streamkit.results import PublishResult

__all__ = ["PUBLISHED_BY", "Publishes", "publish_result", "publishes", "result_type"]

P = ParamSpec("P")
R = TypeVar("R")
Q = ParamSpec("Q")
T = TypeVar("T")

#: Set on a decorated function: the publishers its results go to (outermost last).
PUBLISHED_BY = "__streamkit_published_by__"


class Publishes(Protocol):
    """What a decorated function publishes through (a ``Publisher``)."""

    async def publish(self, partition_key: PartitionKey, fields: Fields) -> PublishResult: ...

    async def publish_many(
        self, items: list[tuple[PartitionKey, Fields]]
    ) -> list[PublishResult]: ...


def publishes(
    publisher: Publishes,
    key: Callable[[Any], PartitionKey],
    *,
    field: str = PAYLOAD_FIELD,
    as_fields: bool = False,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Decorate an async function so that what it returns is also published.

    ``key(item)`` gives each item's partition key. An item is published as
    JSON in ``field`` (as :meth:`Publisher.publish_json`), or, with
    ``as_fields=True``, as the entry's fields (it must then be a mapping). A
    list (or tuple) publishes each item, in one pipeline; ``None`` publishes
    nothing. The value is returned unchanged after it was published; if
    publishing fails the call raises (and a listener retries the entry).
    """

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        if not _is_async(function):
            raise TypeError(
                f"@publisher needs an async function; {_name(function)} is not (write `async def`)"
            )

        def fields_of(item: Any) -> Fields:
            if not as_fields:
                return {field: json_payload(item)}
            if not isinstance(item, Mapping):
                raise TypeError(
                    f"{_name(function)} returned {type(item).__name__}, not a mapping of fields"
                )
            return item

        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            result = await function(*args, **kwargs)
            if result is None:
                return result
            if isinstance(result, list | tuple):
                items = [item for item in result if item is not None]
                if items:
                    await publisher.publish_many([(key(item), fields_of(item)) for item in items])
            else:
                await publisher.publish(key(result), fields_of(result))
            return result

        # Kept on the function (wraps copied the inner one's): a listener
        # registering it sees it publishes, and an AsyncAPI document links them.
        setattr(wrapper, PUBLISHED_BY, (*getattr(function, PUBLISHED_BY, ()), publisher))
        return wrapper

    return decorate


def result_type(function: Callable[..., Any]) -> Any:
    """The type one published item has, from ``function``'s return annotation.

    ``Invoice``, ``Invoice | None`` and ``list[Invoice]`` all give ``Invoice``;
    None when the function has no (resolvable) return annotation.
    """
    try:
        hints = typing.get_type_hints(inspect.unwrap(function))
    except Exception:  # an annotation that does not resolve: no schema, not an error
        return None
    annotation = hints.get("return")
    if annotation is None or annotation is type(None):
        return None
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
    if typing.get_origin(annotation) in (list, tuple) and typing.get_args(annotation):
        annotation = typing.get_args(annotation)[0]
    return annotation


def _is_async(function: Callable[..., Any]) -> bool:
    call = getattr(function, "__call__", None)  # noqa: B004 - callable objects
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or type(function).__name__


def _deprecated(function: Callable[Q, T], name: str, instead: str) -> Callable[Q, T]:
    """``function`` under its old ``name``: the same signature, a warning per call."""

    @functools.wraps(function)
    def alias(*args: Q.args, **kwargs: Q.kwargs) -> T:
        warnings.warn(f"{name} is deprecated: {instead}", DeprecationWarning, stacklevel=2)
        return function(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = name
    alias.__doc__ = f"Deprecated: {instead}."
    return alias


publish_result = _deprecated(
    publishes,
    "publish_result",
    "decorate with @app.publisher(stream_prefix, group=..., key=...) instead",
)
