"""The installed version of the ``streamkit`` distribution (both CLIs, the server)."""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version

__all__ = ["package_version"]


@functools.cache  # reads the distribution's metadata file: ~0.3 ms, once per process
def package_version() -> str:
    try:
        return version("streamkit")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"
