"""What a published message looks like in Redis: fields checked and flattened.

A message is a mapping of field names to values (str, bytes, int or float,
what a stream entry can hold) or a pydantic model, written as its JSON in the
``payload`` field (what ``publish_json`` writes and typed handlers decode).
Everything is checked before anything is sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

import pydantic

__all__ = [
    "PAYLOAD_FIELD",
    "FieldValue",
    "Fields",
    "PartitionKey",
    "field_args",
    "field_args_at",
    "json_payload",
    "text",
]

PartitionKey: TypeAlias = str | bytes
FieldValue: TypeAlias = str | bytes | int | float
# Mapping is invariant in its key type: spell out the common key types so a
# plain dict[str, str] type-checks.
Fields: TypeAlias = (
    Mapping[str, FieldValue]
    | Mapping[bytes, FieldValue]
    | Mapping[str | bytes, FieldValue]
    | pydantic.BaseModel
)
#: The field ``publish_json`` (and ``publish`` of a model) writes the JSON to.
PAYLOAD_FIELD: Final = "payload"

_EXACT_VALUE_TYPES: Final = frozenset({str, bytes, int, float})


def field_args(fields: Fields) -> list[Any]:
    """Flatten ``fields`` into XADD arguments, rejecting what Redis cannot store.

    Exact types are checked first: this runs on every publish.
    """
    if not isinstance(fields, Mapping):
        if isinstance(fields, pydantic.BaseModel):
            return [PAYLOAD_FIELD, fields.model_dump_json()]
        raise TypeError(f"fields must be a mapping of field -> value, got {type(fields).__name__}")
    args: list[Any] = []
    for name, value in fields.items():
        if type(name) is not str and type(name) is not bytes:
            _check_name(name)
        if type(value) not in _EXACT_VALUE_TYPES:
            value = _coerce_value(name, value)
        args.append(name)
        args.append(value)
    if not args:
        raise ValueError("fields must not be empty: a stream entry needs at least one field")
    return args


def field_args_at(position: int, fields: Fields) -> list[Any]:
    """``field_args`` of the message at ``position`` of a batch (named in the error)."""
    try:
        return field_args(fields)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"message #{position}: {exc}") from None


def json_payload(obj: Any) -> str:
    """``obj`` as compact JSON (a pydantic model dumped by pydantic)."""
    if isinstance(obj, pydantic.BaseModel):
        return obj.model_dump_json()
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_name(name: object) -> None:
    if not isinstance(name, str | bytes):
        raise TypeError(f"field names must be str or bytes, got {type(name).__name__}: {name!r}")


def _coerce_value(name: object, value: object) -> FieldValue:
    # bool is an int subclass, but True would be stored as "True": refuse it.
    if isinstance(value, str | bytes):
        return value  # subclasses (StrEnum): redis-py encodes their content
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)  # IntEnum & co.: redis-py would store their repr()
    if isinstance(value, float):
        return float(value)
    raise TypeError(
        f"field {name!r}: a value of type {type(value).__name__} cannot be stored in a stream "
        "entry; use str, bytes, int or float (serialize objects yourself, or use publish_json)"
    )
