"""``streamkit run --workers N``: N processes, distinct stable member ids."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from .support import Admin, eventually, settled_ownership

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)]


async def test_workers_get_their_own_member_ids_and_leave_on_sigterm(
    admin: Admin, names: tuple[str, str], app_process: Any
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 4)
    supervisor = app_process("pod", prefix, group, concurrency=2, args=("--workers", "2"))
    members = ["pod-w0-m0", "pod-w0-m1", "pod-w1-m0", "pod-w1-m1"]

    async def settled() -> bool:
        return settled_ownership(await admin.owners(prefix, group), members, 4)

    with anyio.fail_after(40):
        await eventually(settled, 30, "two workers with two members each")
        assert await supervisor.terminate() == 0, supervisor.logs()
    assert supervisor.logs().count("left the group") == 4, supervisor.logs()
    assert await admin.owners(prefix, group) == {}
