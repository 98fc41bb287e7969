"""Errors a client may see.

Below ``api/`` they are named by an error code only (``CoordinatorError``, the
core's ``Rejected``); ``api/errors.py`` maps codes to HTTP statuses, once.
``ApiError`` carries its own status and is raised by the API layer itself.
"""

from __future__ import annotations

from streamkit_server.core.errors import Rejected

__all__ = ["ApiError", "CoordinatorError", "Rejected"]


class CoordinatorError(Rejected):
    """A refusal of the coordinator's service layer, named by its error code."""


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
