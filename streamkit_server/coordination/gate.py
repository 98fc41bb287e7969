"""The terminating gate (seed 000: CoordinatorShutdownGate).

Critical sections (heartbeats, admin mutations) pass the gate before they
touch the group mutex.  Once the process is terminating, new ones are refused
with 503 COORDINATOR_TERMINATING so clients retry against another coordinator,
while the ones already inside finish their Redis write and release the mutex;
shutdown waits for them (``wait_idle``).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import anyio

__all__ = ["CoordinatorSuspended", "CoordinatorTerminating", "TerminatingGate"]


class CoordinatorTerminating(Exception):
    """Raised to a caller that arrives after the gate closed."""


class CoordinatorSuspended(Exception):
    """Raised to a caller while the process may not decide anything (``suspend``)."""


class TerminatingGate:
    def __init__(self) -> None:
        self._terminating = False
        self._suspended: str | None = None
        self._inside = 0
        # Created by ``wait_idle`` only (shutdown): entering and leaving is on
        # every heartbeat's path, and needs no event while nobody waits.
        self._idle: anyio.Event | None = None
        self._section = _CriticalSection(self)

    @property
    def terminating(self) -> bool:
        return self._terminating

    @property
    def inside(self) -> int:
        return self._inside

    @property
    def suspended(self) -> str | None:
        """Why new critical sections are refused for now (None: they are not)."""
        return self._suspended

    def close(self) -> None:
        """Enter terminating mode; idempotent."""
        self._terminating = True

    def suspend(self, reason: str) -> None:
        """Refuse new critical sections until ``resume``: this process found that
        its decisions could contradict another live process's (other timings)."""
        self._suspended = reason

    def resume(self) -> None:
        self._suspended = None

    def critical(self) -> AbstractAsyncContextManager[None]:
        """``async with gate.critical():`` around a critical section.

        One object serves every section: it keeps no state of its own (the
        count is the gate's), so concurrent sections can share it.
        """
        return self._section

    def _enter(self) -> None:
        if self._terminating:
            raise CoordinatorTerminating("coordinator is shutting down; retry another instance")
        if self._suspended is not None:
            raise CoordinatorSuspended(self._suspended)
        self._inside += 1

    def _leave(self) -> None:
        self._inside -= 1
        if self._inside == 0 and self._idle is not None:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no critical section is inside; False on timeout."""
        if self._inside == 0:
            return True
        if self._idle is None or self._idle.is_set():
            self._idle = anyio.Event()
        idle = self._idle
        with anyio.move_on_after(timeout_s):
            await idle.wait()
            return True
        return False


class _CriticalSection(AbstractAsyncContextManager[None]):
    __slots__ = ("_gate",)

    def __init__(self, gate: TerminatingGate) -> None:
        self._gate = gate

    async def __aenter__(self) -> None:
        self._gate._enter()

    async def __aexit__(self, *exc_info: object) -> None:
        self._gate._leave()
