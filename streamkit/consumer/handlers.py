"""What a handler's signature asks for: one ``Message``, a typed payload, or a batch.

``inspect_handler`` reads the parameters without a default (parameters with a
default, such as ``Provide[...]``, are left to dependency injection):

* ``(msg)`` / ``(msg: Message)``: one message, as always;
* ``(order: T)`` or ``(order: T, msg: Message)``: the entry's payload field
  decoded into ``T``, any type a pydantic ``TypeAdapter`` accepts (a model,
  ``dict``, ``TypedDict``, a dataclass, ``int``, a union...) from JSON, or the
  raw bytes for ``bytes``;
* ``(msgs: list[Message])``, ``(orders: list[T])`` or
  ``(orders: list[T], msgs: list[Message])``: a batch of one shard's entries
  (with ``batch=False``, ``list[T]`` is one entry's payload instead).

An annotation no adapter can be built for is refused here, at registration:
a handler that silently received a ``Message`` it never acks would let the
entries pile up as pending.

``adapt`` turns the handler into the coroutine the poller calls.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import pydantic

from streamkit.consumer.failure import PayloadError
from streamkit.consumer.message import Message

__all__ = ["BatchHandler", "Handler", "HandlerShape", "decode_payload", "inspect_handler"]

#: One message at a time.
Handler = Callable[[Message], Awaitable[None]]
#: A batch of one shard's messages; answers the entries that failed before the
#: user's code saw them (an invalid payload), by position.
BatchHandler = Callable[[list[Message]], Awaitable[Mapping[int, BaseException]]]

_NO_ERRORS: Mapping[int, BaseException] = {}


class HandlerSignatureError(TypeError):
    """The handler's parameters do not fit any supported shape."""


_EMPTY = inspect.Parameter.empty


@dataclass(frozen=True, slots=True)
class HandlerShape:
    batch: bool
    #: The type payloads are decoded into (an annotation), or None for messages.
    payload_type: Any
    #: With a payload type: whether the message(s) are passed too, as the second argument.
    with_message: bool
    #: The payload type's adapter, built once at registration (None: messages, or raw bytes).
    adapter: pydantic.TypeAdapter[Any] | None = None
    #: The payload parameter's name (for errors and documents).
    parameter: str = ""

    @property
    def model(self) -> Any:
        """The payload type (kept under its first name: it was a pydantic model only)."""
        return self.payload_type

    @property
    def receives_messages(self) -> bool:
        return self.payload_type is None or self.with_message

    def decode(self, message: Message, field: str) -> Any:
        """The entry's ``field`` decoded into the payload type (or ``PayloadError``)."""
        raw = message.raw_fields.get(field.encode())
        if raw is None:
            raise PayloadError(
                f"entry {message.id} of {message.stream_key} has no field {field!r} "
                f"to decode a {_type_name(self.payload_type)} from"
            )
        if self.adapter is None:  # bytes: the field as Redis stored it
            return raw
        try:
            return self.adapter.validate_json(raw)
        except pydantic.ValidationError as exc:
            raise PayloadError(
                f"invalid {_type_name(self.payload_type)} payload: {_one_line(exc)}"
            ) from exc


def inspect_handler(handler: Callable[..., Any], batch: bool | None = None) -> HandlerShape:
    """The shape of ``handler``; ``batch`` forces (True) or forbids (False) a batch."""
    params = [
        p
        for p in _signature(handler).parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if not params:
        raise HandlerSignatureError("the handler must take the message as its first parameter")
    if len(params) > 2:
        names = ", ".join(p.name for p in params[2:])
        raise HandlerSignatureError(
            f"the handler has parameters without a default the listener cannot fill: {names} "
            "(dependencies need a Provide[...] default)"
        )
    params = [p.replace(annotation=_resolved(p.name, p.annotation)) for p in params]
    first_param = params[0]
    first_list, first = _unlist(first_param.annotation)
    if first_list and batch is False:
        if first is Message:
            raise HandlerSignatureError("batch=False, but the handler takes a list of messages")
        # batch=False: a list is one entry's payload, not a batch.
        first_list, first = False, first_param.annotation
    is_batch = first_list if batch is None else batch
    if is_batch and not first_list and first_param.annotation is not _EMPTY:
        raise HandlerSignatureError("batch=True: annotate the first parameter as a list[...]")
    payload_type = None if first in (_EMPTY, Message) else first
    adapter = _adapter(first_param.name, payload_type)
    with_message = False
    if len(params) == 2:
        if payload_type is None:
            raise HandlerSignatureError(
                "a second parameter is only filled when the first is a typed payload "
                "(order: Order, msg: Message)"
            )
        second_list, second = _unlist(params[1].annotation)
        if second not in (Message, _EMPTY) or (second_list and not is_batch):
            raise HandlerSignatureError(
                f"the second parameter must be a {'list[Message]' if is_batch else 'Message'}"
            )
        with_message = True
    return HandlerShape(
        batch=is_batch,
        payload_type=payload_type,
        with_message=with_message,
        adapter=adapter,
        parameter=first_param.name,
    )


def _adapter(parameter: str, payload_type: Any) -> pydantic.TypeAdapter[Any] | None:
    if payload_type is None or payload_type is bytes:
        return None
    try:
        return pydantic.TypeAdapter(payload_type)
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HandlerSignatureError(
            f"parameter {parameter!r}: cannot decode a payload into "
            f"{_type_name(payload_type)} ({reason})"
        ) from None


def decode_payload(message: Message, model: Any, field: str) -> Any:
    """The entry's JSON ``field`` validated into ``model`` (``PayloadError`` if it cannot be)."""
    return HandlerShape(False, model, False, _adapter("payload", model)).decode(message, field)


def adapt_single(handler: Callable[..., Any], shape: HandlerShape, payload_field: str) -> Handler:
    """``handler`` as ``async (msg) -> None`` (sync handlers run in a worker thread)."""
    call = _caller(handler)
    if shape.payload_type is None:
        single: Handler = call  # no wrapper on the hot path
        return single
    decode = shape.decode

    async def typed(message: Message) -> None:
        value = decode(message, payload_field)
        await (call(value, message) if shape.with_message else call(value))

    return typed


def adapt_batch(
    handler: Callable[..., Any], shape: HandlerShape, payload_field: str
) -> BatchHandler:
    """``handler`` as ``async (msgs) -> {position: decode error}``."""
    call = _caller(handler)
    typed = shape.payload_type is not None
    decode = shape.decode

    async def batch(messages: list[Message]) -> Mapping[int, BaseException]:
        if not typed:
            await call(messages)
            return _NO_ERRORS
        errors: dict[int, BaseException] = {}
        values: list[Any] = []
        valid: list[Message] = []
        for index, message in enumerate(messages):
            try:
                values.append(decode(message, payload_field))
            except PayloadError as exc:
                errors[index] = exc
            else:
                valid.append(message)
        if values:
            await (call(values, valid) if shape.with_message else call(values))
        return errors

    return batch


def _caller(handler: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    if _is_async(handler):
        return handler

    async def in_thread(*args: Any) -> Any:
        # Sync handlers block; keep them off the event loop.  ack() works from
        # the thread: it only queues the id.
        result = await anyio.to_thread.run_sync(lambda: handler(*args))
        if inspect.isawaitable(result):
            await result
        return result

    return in_thread


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects
    return call is not None and inspect.iscoroutinefunction(call)


def _signature(handler: Callable[..., Any]) -> inspect.Signature:
    try:
        return inspect.signature(handler, eval_str=True)
    except (NameError, TypeError, SyntaxError):
        # An annotation that cannot be evaluated here (a TYPE_CHECKING import,
        # a local class): take the others at face value, treat it as unknown.
        signature = inspect.signature(handler)
        globalns = getattr(inspect.unwrap(handler), "__globals__", {})
        params = []
        for p in signature.parameters.values():
            annotation = p.annotation
            if isinstance(annotation, str):
                try:
                    annotation = eval(annotation, globalns)  # the handler's own annotation text
                except Exception:
                    annotation = _Unresolved(annotation)
            params.append(p.replace(annotation=annotation))
        return signature.replace(parameters=params)


@dataclass(frozen=True, slots=True)
class _Unresolved:
    """An annotation whose text does not evaluate in the handler's module."""

    text: str


def _resolved(parameter: str, annotation: Any) -> Any:
    if not isinstance(annotation, _Unresolved):
        return annotation
    if annotation.text.rsplit(".", 1)[-1] == "Message":
        return Message
    # Taking it as a Message would hand a typed handler messages it never acks.
    raise HandlerSignatureError(
        f"parameter {parameter!r}: the annotation {annotation.text!r} does not resolve in the "
        "handler's module (import the type at run time, not only under TYPE_CHECKING)"
    )


def _unlist(annotation: Any) -> tuple[bool, Any]:
    """(is a list, element type) of a parameter annotation."""
    if typing.get_origin(annotation) in (list, typing.List):  # noqa: UP006
        args = typing.get_args(annotation)
        return True, args[0] if args else inspect.Parameter.empty
    if annotation is list:
        return True, inspect.Parameter.empty
    return False, annotation


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _one_line(exc: pydantic.ValidationError) -> str:
    """The validation errors on one line, each with the field it is about (for ``x-error``)."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "(payload)"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)
