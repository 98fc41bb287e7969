"""Calls a member makes all the time search for no module.

An import that fails is not cached: every later attempt searches ``sys.path``
again, a ``stat`` per entry.  httpcore asks for ``sniffio`` on every request,
so without that package installed each heartbeat paid such a search (about a
quarter of an idle member's CPU, and slow whenever the file system is).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pytest

from streamkit.coordinator_client import CoordinatorClient
from streamkit.testing.coordinator import CoordinatorProcess

pytestmark = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)


class _Searches(importlib.abc.MetaPathFinder):
    """Records every module search; finds nothing (the next finders do)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        self.names.append(fullname)
        return None


async def test_coordinator_calls_search_for_no_module(
    coordinator: CoordinatorProcess, admin: Any, names: tuple[str, str]
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    user, password = coordinator.admin_auth
    async with CoordinatorClient(coordinator.url, username=user, password=password) as client:
        await client.get_group(prefix, group)  # first use: whatever loads lazily, once
        searches = _Searches()
        sys.meta_path.insert(0, searches)
        try:
            for _ in range(5):
                await client.get_group(prefix, group)
        finally:
            sys.meta_path.remove(searches)
    assert searches.names == [], f"module searches on every call: {sorted(set(searches.names))}"
