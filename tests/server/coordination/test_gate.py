"""The terminating gate on its own: counting sections, refusing, waiting for idle."""

from __future__ import annotations

import asyncio

import pytest

from streamkit_server.coordination.gate import (
    CoordinatorSuspended,
    CoordinatorTerminating,
    TerminatingGate,
)


async def test_wait_idle_waits_for_every_section_inside() -> None:
    gate = TerminatingGate()
    assert await gate.wait_idle(0.01)  # nobody inside: at once
    left = asyncio.Event()

    async def section(hold: asyncio.Event) -> None:
        async with gate.critical():
            await hold.wait()
        left.set()

    first, second = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(section(first)), asyncio.create_task(section(second))]
    await asyncio.sleep(0)
    assert gate.inside == 2
    assert not await gate.wait_idle(0.02)  # both still inside: times out
    waiter = asyncio.create_task(gate.wait_idle(5.0))
    first.set()
    await left.wait()
    await asyncio.sleep(0.01)
    assert gate.inside == 1 and not waiter.done()  # one left, one inside
    second.set()
    assert await waiter
    assert gate.inside == 0
    await asyncio.gather(*tasks)
    # Busy again after an idle: a new wait waits for the new section.
    third = asyncio.Event()
    task = asyncio.create_task(section(third))
    await asyncio.sleep(0)
    assert not await gate.wait_idle(0.02)
    third.set()
    await task
    assert await gate.wait_idle(0.01)


async def test_a_section_that_raises_still_leaves() -> None:
    gate = TerminatingGate()
    with pytest.raises(RuntimeError):
        async with gate.critical():
            raise RuntimeError("boom")
    assert gate.inside == 0
    assert await gate.wait_idle(0.01)


async def test_closed_or_suspended_gate_refuses_new_sections() -> None:
    gate = TerminatingGate()
    gate.suspend("other timings")
    with pytest.raises(CoordinatorSuspended):
        async with gate.critical():
            pass
    gate.resume()
    async with gate.critical():
        gate.close()  # a section inside finishes; the next is refused
    with pytest.raises(CoordinatorTerminating):
        async with gate.critical():
            pass
    assert gate.inside == 0
