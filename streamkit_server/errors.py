"""Errors that carry their HTTP answer (status, errorCode, message)."""

from __future__ import annotations

__all__ = ["ApiError"]


class ApiError(Exception):
    """A client-visible failure, rendered as ``ErrorResponse``."""

    def __init__(
        self, status_code: int, error_code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error_code = error_code
        self.message = message
        self.headers = headers or {}
