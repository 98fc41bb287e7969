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

from streamkit_server.store.keys import token_secret_key
from streamkit_server.store.records import RedisClient

__all__ = ["SECRET_BYTES", "shared_token_secret", "token_secret_key"]

SECRET_BYTES: Final = 32


async def shared_token_secret(client: RedisClient, key_prefix: str) -> bytes:
    """The stored secret, creating it first when there is none (race-free: SET NX)."""
    key = token_secret_key(key_prefix)
    for _attempt in range(3):
        await client.set(key, secrets.token_hex(SECRET_BYTES), nx=True)
        stored = await client.get(key)
        # None only if an operator deleted the key (rotation) between the two
        # commands: create it again rather than use a secret nobody shares.
        if stored:
            return stored if isinstance(stored, bytes) else str(stored).encode()
    raise RuntimeError(f"could not create or read the shared token secret at {key!r}")
