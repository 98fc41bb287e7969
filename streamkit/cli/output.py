"""What the CLI prints: text from a coordinator or from Redis is data, never
terminal control.

A member id, a stream key, an error message or a dead letter's fields come
from other programs (or from someone with a member credential).  Printed raw,
an escape sequence among them can retitle the terminal, move the cursor or
repaint lines, and a bidi override can make a line read differently from its
bytes.  Every line the CLI prints therefore passes through ``printable``,
which shows such characters as escapes; JSON output escapes them the JSON way
so it stays valid JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import typer

__all__ = ["echo", "echo_json", "printable"]

#: C0 and C1 controls (newline included: one printed record, one line), DEL,
#: the bidi marks, embeddings, overrides and isolates, the Unicode line and
#: paragraph separators, and the byte-order mark.
_UNSAFE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def printable(text: str) -> str:
    """``text`` with every control or direction-changing character escaped."""
    return _UNSAFE.sub(_escape, text)


def echo(text: str, *, err: bool = False) -> None:
    typer.echo(printable(text), err=err)


def echo_json(document: Any) -> None:
    """One JSON document on one line; non-ASCII text kept, controls escaped."""
    # json.dumps escapes C0 controls already; C1 controls and bidi marks it
    # leaves raw with ensure_ascii=False, so they are escaped here (outside a
    # string none of them can occur).
    typer.echo(_UNSAFE.sub(_json_escape, json.dumps(document, ensure_ascii=False)))
