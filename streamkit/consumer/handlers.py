"""What a handler's signature asks for: one ``Message``, a pydantic model, or a batch.

``inspect_handler`` reads the parameters without a default (parameters with a
default, such as ``Provide[...]``, are left to dependency injection):

* ``(msg)`` / ``(msg: Message)``: one message, as always;
* ``(order: Order)`` or ``(order: Order, msg: Message)``: the entry's JSON
  payload field decoded into the pydantic model ``Order``;
* ``(msgs: list[Message])``, ``(orders: list[Order])`` or
  ``(orders: list[Order], msgs: list[Message])``: a batch of one shard's entries.

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


@dataclass(frozen=True, slots=True)
class HandlerShape:
    batch: bool
    #: The pydantic model payloads are decoded into, or None for messages.
    model: type[pydantic.BaseModel] | None
    #: With a model: whether the message(s) are passed too, as the second argument.
    with_message: bool

    @property
    def receives_messages(self) -> bool:
        return self.model is None or self.with_message


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
    first_list, first = _unlist(params[0].annotation)
    model = first if _is_model(first) else None
    is_batch = first_list if batch is None else batch
    if first_list and not is_batch:
        raise HandlerSignatureError("batch=False, but the handler takes a list")
    if is_batch and not first_list and params[0].annotation is not inspect.Parameter.empty:
        if model is not None or first is Message:
            raise HandlerSignatureError("batch=True: annotate the first parameter as a list[...]")
    with_message = False
    if len(params) == 2:
        if model is None:
            raise HandlerSignatureError(
                "a second parameter is only filled when the first is a pydantic model "
                "(order: Order, msg: Message)"
            )
        second_list, second = _unlist(params[1].annotation)
        if second not in (Message, inspect.Parameter.empty) or (second_list and not is_batch):
            raise HandlerSignatureError(
                f"the second parameter must be a {'list[Message]' if is_batch else 'Message'}"
            )
        with_message = True
    return HandlerShape(batch=is_batch, model=model, with_message=with_message)


def decode_payload(
    message: Message, model: type[pydantic.BaseModel], field: str
) -> pydantic.BaseModel:
    """The entry's JSON ``field`` validated into ``model`` (``PayloadError`` if it cannot be)."""
    raw = message.raw_fields.get(field.encode())
    if raw is None:
        raise PayloadError(
            f"entry {message.id} of {message.stream_key} has no field {field!r} "
            f"to decode a {model.__name__} from"
        )
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        raise PayloadError(f"invalid {model.__name__} payload: {exc}") from exc


def adapt_single(handler: Callable[..., Any], shape: HandlerShape, payload_field: str) -> Handler:
    """``handler`` as ``async (msg) -> None`` (sync handlers run in a worker thread)."""
    call = _caller(handler)
    model = shape.model
    if model is None:
        single: Handler = call  # no wrapper on the hot path
        return single

    async def typed(message: Message) -> None:
        value = decode_payload(message, model, payload_field)
        await (call(value, message) if shape.with_message else call(value))

    return typed


def adapt_batch(
    handler: Callable[..., Any], shape: HandlerShape, payload_field: str
) -> BatchHandler:
    """``handler`` as ``async (msgs) -> {position: decode error}``."""
    call = _caller(handler)
    model = shape.model

    async def batch(messages: list[Message]) -> Mapping[int, BaseException]:
        if model is None:
            await call(messages)
            return _NO_ERRORS
        errors: dict[int, BaseException] = {}
        values: list[pydantic.BaseModel] = []
        valid: list[Message] = []
        for index, message in enumerate(messages):
            try:
                values.append(decode_payload(message, model, payload_field))
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
                    annotation = inspect.Parameter.empty
            params.append(p.replace(annotation=annotation))
        return signature.replace(parameters=params)


def _unlist(annotation: Any) -> tuple[bool, Any]:
    """(is a list, element type) of a parameter annotation."""
    if typing.get_origin(annotation) in (list, typing.List):  # noqa: UP006
        args = typing.get_args(annotation)
        return True, args[0] if args else inspect.Parameter.empty
    if annotation is list:
        return True, inspect.Parameter.empty
    return False, annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel)
