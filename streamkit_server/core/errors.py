"""Refusals named by an error code: the HTTP status is the API layer's business."""

from __future__ import annotations

__all__ = ["Rejected"]


class Rejected(Exception):
    """A request the rules or the current state do not allow.

    Carries an ``error_code`` (the wire's ``errorCode``) and a message; the
    API layer maps the code to an HTTP status (``api/errors.py``, one table).
    """

    def __init__(self, error_code: str, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message
