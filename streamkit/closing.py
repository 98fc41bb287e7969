"""``async with``, the same way for the app, the publisher, the coordinator client and the
coordinator's stream lock (a leaf: the server imports it too)."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncClosing"]


class AsyncClosing:
    """``async with x:`` runs ``await x.start()``, and ``await x.aclose()`` on the way out."""

    async def start(self) -> None:
        """Nothing to start unless a subclass says so."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
