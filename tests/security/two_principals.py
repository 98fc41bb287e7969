"""Two MEMBER principals on a private coordinator: what the principal tests share."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from helpers import join_body

from streamkit.testing import RedisServer, RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.auth.principals import hash_password

API = "/coord/v1"
PASSWORDS = {"svc-a": "pw-a-9f1c", "svc-b": "pw-b-2e7d"}
#: (username, password) of each principal.
A, B = (("svc-a", PASSWORDS["svc-a"]), ("svc-b", PASSWORDS["svc-b"]))


def start(
    redis: RedisServer, factory: Callable[..., CoordinatorProcess], **env: str
) -> CoordinatorProcess:
    """A coordinator on ``redis`` whose principals are svc-a and svc-b (MEMBER),
    with ``env`` as further ``STREAMKIT_SERVER_*`` settings."""
    principals = [
        {"username": name, "passwordHash": hash_password(pw), "roles": ["MEMBER"]}
        for name, pw in PASSWORDS.items()
    ]
    return factory(
        RedisTarget(redis.url, cluster=False),
        env={"STREAMKIT_SERVER_PRINCIPALS": json.dumps(principals), **env},
    )


def heartbeat(member: str, epoch: int, **extra: Any) -> dict[str, Any]:
    """A heartbeat body (no incarnation unless given, as the reference clients)."""
    return join_body(member, memberEpoch=epoch, **extra)
