"""streamkit coordinator server (``streamkit-server``).

Lazy: importing a subpackage (``streamkit_server.core``, ``streamkit_server.store.keys``)
must not pull in FastAPI, redis-py or OpenTelemetry, so the two names below
are resolved on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamkit_server.api import create_app
    from streamkit_server.settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from streamkit_server.api import create_app

        return create_app
    if name == "ServerSettings":
        from streamkit_server.settings import ServerSettings

        return ServerSettings
    raise AttributeError(f"module 'streamkit_server' has no attribute {name!r}")
