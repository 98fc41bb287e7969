"""The terminating gate (seed 000: CoordinatorShutdownGate).

Critical sections (heartbeats, admin mutations) pass the gate before they
touch the group mutex.  Once the process is terminating, new ones are refused
with 503 COORDINATOR_TERMINATING so clients retry against another coordinator,
while the ones already inside finish their Redis write and release the mutex;
shutdown waits for them (``wait_idle``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

__all__ = ["CoordinatorTerminating", "TerminatingGate"]


class CoordinatorTerminating(Exception):
    """Raised to a caller that arrives after the gate closed."""


class TerminatingGate:
    def __init__(self) -> None:
        self._terminating = False
        self._inside = 0
        self._idle = anyio.Event()
        self._idle.set()

    @property
    def terminating(self) -> bool:
        return self._terminating

    @property
    def inside(self) -> int:
        return self._inside

    def close(self) -> None:
        """Enter terminating mode; idempotent."""
        self._terminating = True

    @asynccontextmanager
    async def critical(self) -> AsyncIterator[None]:
        if self._terminating:
            raise CoordinatorTerminating("coordinator is shutting down; retry another instance")
        if self._inside == 0:
            self._idle = anyio.Event()
        self._inside += 1
        try:
            yield
        finally:
            self._inside -= 1
            if self._inside == 0:
                self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no critical section is inside; False on timeout."""
        with anyio.move_on_after(timeout_s):
            await self._idle.wait()
            return True
        return False
