"""Per-principal token versions in Redis: revoking a principal's tokens everywhere.

Every token carries the version its principal had when it was issued; a
request with a bearer token is accepted only while that still equals the
version in Redis.  ``revoke`` bumps it (admin endpoint and CLI), so every
coordinator process sharing the Redis refuses the older tokens at once,
without a revocation list that grows.
"""

from __future__ import annotations

from streamkit_server.store import RedisClient

__all__ = ["current_version", "revoke", "token_versions_key"]


def token_versions_key(key_prefix: str) -> str:
    return f"{key_prefix}:auth:token-versions"


async def current_version(client: RedisClient, key_prefix: str, username: str) -> int:
    raw = await client.hget(token_versions_key(key_prefix), username)
    return int(raw) if raw is not None else 0


async def revoke(client: RedisClient, key_prefix: str, username: str) -> int:
    """Bump ``username``'s version; returns the new one."""
    return int(await client.hincrby(token_versions_key(key_prefix), username, 1))
