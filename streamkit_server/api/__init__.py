"""The HTTP layer: FastAPI app factory, routers and error handlers."""

from streamkit_server.api.app import create_app

__all__ = ["create_app"]
