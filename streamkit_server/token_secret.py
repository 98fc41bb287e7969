"""The bearer-token signing secret shared by every coordinator process on one Redis.

Without ``STREAMKIT_SERVER_TOKEN_SECRET`` the first process to start creates a
random secret with ``SET NX`` and every other process (and every restart)
reads that one, so a token issued by one process is accepted by all of them
without an operator copying a secret around.  Whoever can read this key can
mint tokens; it lives next to metadata that grants the same power anyway.
"""

from __future__ import annotations

import secrets
from typing import Final

from streamkit_server.store import RedisClient

__all__ = ["SECRET_BYTES", "shared_token_secret", "token_secret_key"]

SECRET_BYTES: Final = 32


def token_secret_key(key_prefix: str) -> str:
    return f"{key_prefix}:auth:token-secret"


async def shared_token_secret(client: RedisClient, key_prefix: str) -> bytes:
    """The stored secret, creating it first when there is none (race-free: SET NX)."""
    key = token_secret_key(key_prefix)
    candidate = secrets.token_hex(SECRET_BYTES)
    await client.set(key, candidate, nx=True)
    stored = await client.get(key)
    if not stored:
        # Deleted between the two commands (an operator rotating it): ours is
        # as good as any, and the next start will agree on whatever is stored.
        await client.set(key, candidate)
        stored = candidate
    text = stored.decode() if isinstance(stored, bytes) else str(stored)
    return text.encode()
