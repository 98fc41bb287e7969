"""One emitter for every audit record: bounded, logged, copied to the stream.

Request records (``api/audit.py``) and the service's own records (an ignored
rollback claim, ``runtime.Runtime._audit``) both go through ``emit``, so they
share one size bound, one logger and one stream copy.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

from .audit_stream import AuditStream

__all__ = ["MAX_RECORD_BYTES", "audit_log", "bounded", "emit"]

audit_log = logging.getLogger("streamkit_server.audit")

_FIELDS_MAX: Final = 256
#: The longest audit record (JSON, UTF-8): ~20 fields of at most _FIELDS_MAX characters.
MAX_RECORD_BYTES: Final = 8 * 1024


def bounded(record: dict[str, Any]) -> dict[str, Any]:
    """Every caller-supplied string cut to ``_FIELDS_MAX`` characters.

    Headers, path parameters and body fields all end up here; cut, a record
    stays under ``MAX_RECORD_BYTES`` whatever a caller sends (the audit
    stream's MAXLEN bounds the count, this bounds each entry).
    """
    out: dict[str, Any] = {}
    for name, value in record.items():
        if isinstance(value, str) and len(value) > _FIELDS_MAX:
            value = value[:_FIELDS_MAX] + "…"
            out["truncated"] = True
        out[name] = value
    return out


def emit(record: dict[str, Any], stream: AuditStream | None) -> None:
    """Log ``record`` as one JSON line and queue its copy on ``stream``."""
    line = json.dumps(bounded(record), separators=(",", ":"), sort_keys=True, default=str)
    if len(line.encode()) > MAX_RECORD_BYTES:  # cannot happen with bounded(); a backstop
        line = json.dumps({"kind": record.get("kind"), "status": record.get("status"),
                           "truncated": True}, sort_keys=True)  # fmt: skip
    audit_log.info(line)
    if stream is not None:
        stream.submit(line)  # queued, never awaited: Redis cannot slow the answer
