"""Bearer tokens for browser tests of roles the server has no user for yet.

The coordinator knows one principal (the admin, all roles), so a READ-only
caller is a token minted here with the server's own token format and the
test launcher's token secret.  When configurable principals exist, replace
``read_only_token`` by a login of a real READ user; nothing else changes.
"""

from __future__ import annotations

from streamkit.testing.coordinator import TEST_TOKEN_SECRET
from streamkit_server.auth.security import Authenticator, Principal, Role

__all__ = ["read_only_token"]


def read_only_token(username: str = "viewer", ttl_seconds: int = 3600) -> str:
    """A token the test coordinators accept, carrying only the READ role."""
    signer = Authenticator("-", "-", TEST_TOKEN_SECRET.encode(), ttl_seconds)
    token, _expires = signer.issue(Principal(username, frozenset({Role.READ}), "bearer"))
    return token
