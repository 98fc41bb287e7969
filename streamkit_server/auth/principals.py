"""Principals from settings: usernames, scrypt password hashes and roles.

A principals document is JSON, inline (``STREAMKIT_SERVER_PRINCIPALS``) or in a
file (``STREAMKIT_SERVER_PRINCIPALS_FILE``)::

    [{"username": "dash", "passwordHash": "scrypt$16384$8$1$<salt>$<hash>",
      "roles": ["READ"]}]

Only hashes are configured (``streamkit-server hash-password`` prints one);
the bootstrap admin is the single principal whose plain password comes from
the environment.  Roles are READ, WRITE, MEMBER, or ADMIN (all three).
Optional ``streams`` and ``groups`` lists of patterns limit the streams and
groups the principal may name (``streamkit_server.auth.scope``)::

    [{"username": "orders-consumer", "passwordHash": "scrypt$...",
      "roles": ["MEMBER"], "groups": ["orders/*"]}]
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any, Final

from streamkit_server.auth.scope import UNLIMITED, Scope, parse_patterns

__all__ = ["PrincipalEntry", "credential_fingerprint", "hash_password", "parse_principals",
           "verify_password"]  # fmt: skip

# scrypt cost: ~16 MiB and tens of milliseconds per check, enough to make
# offline guessing expensive; Basic callers are cached (see Authenticator).
_N: Final = 16384
_R: Final = 8
_P: Final = 1
_SCHEME: Final = "scrypt"
ROLE_NAMES: Final = frozenset({"READ", "WRITE", "MEMBER", "ADMIN"})


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"{_SCHEME}${_N}${_R}${_P}${_b64(salt)}${_b64(digest)}"


def _parse_hash(stored: str) -> tuple[int, int, int, bytes, bytes]:
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != _SCHEME:
        raise ValueError("a password hash must look like scrypt$N$r$p$salt$hash")
    n, r, p = (int(x) for x in parts[1:4])
    return n, r, p, base64.b64decode(parts[4]), base64.b64decode(parts[5])


def verify_password(password: str, stored: str) -> bool:
    n, r, p, salt, expected = _parse_hash(stored)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=len(expected), maxmem=2**26
    )
    return hmac.compare_digest(digest, expected)


def credential_fingerprint(secret_material: str) -> str:
    """A short digest of the stored credential, carried in tokens.

    A password change changes it, so every token issued before the change
    stops verifying on every process that runs with the new settings.
    """
    return hashlib.sha256(b"streamkit-credential:" + secret_material.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class PrincipalEntry:
    username: str
    password_hash: str
    # Role names as configured (ADMIN included); security.expand_roles maps them.
    roles: frozenset[str]
    #: The streams/groups it may name (``streams``/``groups`` patterns; auth/scope.py).
    scope: Scope = UNLIMITED


def _entry(raw: Any) -> PrincipalEntry:
    if not isinstance(raw, dict):
        raise ValueError("each principal must be an object")
    username = raw.get("username")
    password_hash = raw.get("passwordHash")
    roles = raw.get("roles")
    if not isinstance(username, str) or not username.strip():
        raise ValueError("a principal needs a non-blank username")
    if not isinstance(password_hash, str):
        raise ValueError(f"principal {username!r} needs a passwordHash")
    _parse_hash(password_hash)
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise ValueError(f"principal {username!r} needs a list of roles")
    unknown = [r for r in roles if r not in ROLE_NAMES]
    if unknown:
        raise ValueError(f"principal {username!r} has unknown roles {unknown}")
    scope = Scope(
        parse_patterns(raw.get("streams"), f"principal {username!r}: streams"),
        parse_patterns(raw.get("groups"), f"principal {username!r}: groups"),
    )
    return PrincipalEntry(username, password_hash, frozenset(roles), scope)


def parse_principals(text: str) -> dict[str, PrincipalEntry]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        # Position only: the document holds password hashes.
        raise ValueError(f"principals are not valid JSON (line {exc.lineno})") from None
    if not isinstance(raw, list):
        raise ValueError("principals must be a JSON list")
    out: dict[str, PrincipalEntry] = {}
    for item in raw:
        entry = _entry(item)
        if entry.username in out:
            raise ValueError(f"principal {entry.username!r} is listed twice")
        out[entry.username] = entry
    return out
