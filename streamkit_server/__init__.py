"""streamkit coordinator server (``streamkit-server``)."""

from streamkit_server.api import create_app
from streamkit_server.settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]
