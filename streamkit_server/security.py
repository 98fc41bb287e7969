"""Authentication: Basic with the admin credentials, and signed bearer tokens.

Tokens are ``base64url(claims JSON) "." base64url(HMAC-SHA256(secret, first part))``
with claims ``sub``, ``roles``, ``iat``, ``exp`` (seconds).  They are checked
with a constant-time comparison and expire; there is no revocation list, so
rotate the secret (``STREAMKIT_SERVER_TOKEN_SECRET``, or the shared key in
Redis when none is configured: see ``token_secret``) to invalidate every
issued token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

__all__ = [
    "ADMIN_ROLES",
    "AuthError",
    "Authenticator",
    "Principal",
    "Role",
    "expand_roles",
]


class Role(StrEnum):
    READ = "READ"
    WRITE = "WRITE"
    MEMBER = "MEMBER"


# Aliases accepted in tokens (and by operators used to the reference's names).
_ALIASES: Final[dict[str, frozenset[Role]]] = {
    "ADMIN": frozenset(Role),
    "MONITOR": frozenset({Role.READ}),
}
ADMIN_ROLES: Final = frozenset(Role)
REALM: Final = "streamkit-coordinator"


def expand_roles(names: list[str] | frozenset[str]) -> frozenset[Role]:
    out: set[Role] = set()
    for name in names:
        if name in _ALIASES:
            out |= _ALIASES[name]
        elif name in Role.__members__:
            out.add(Role(name))
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class Principal:
    username: str
    roles: frozenset[Role]
    method: str  # "basic" or "bearer"


class AuthError(Exception):
    """Missing or invalid credentials (401)."""

    def __init__(self, message: str, *, bearer_error: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.bearer_error = bearer_error

    @property
    def challenge(self) -> str:
        bearer = f'Bearer realm="{REALM}"'
        if self.bearer_error:
            bearer += ', error="invalid_token"'
        return f'Basic realm="{REALM}", charset="UTF-8", {bearer}'


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Authenticator:
    def __init__(
        self,
        admin_username: str,
        admin_password: str,
        secret: bytes | None,
        token_ttl_seconds: int,
    ) -> None:
        self._user = admin_username.encode()
        self._password = admin_password.encode()
        self.admin_username = admin_username
        # None until the runtime has read the shared secret from Redis.
        self.secret = secret
        self.token_ttl_seconds = token_ttl_seconds

    def check_password(self, username: str, password: str) -> Principal | None:
        # Both comparisons always run so timing does not reveal which one failed.
        user_ok = hmac.compare_digest(username.encode(), self._user)
        pass_ok = hmac.compare_digest(password.encode(), self._password)
        if user_ok and pass_ok:
            return Principal(self.admin_username, ADMIN_ROLES, "basic")
        return None

    def issue(self, principal: Principal, now: float | None = None) -> tuple[str, int]:
        """A signed token for ``principal``; returns (token, expiry in epoch seconds)."""
        issued = int(time.time() if now is None else now)
        expires = issued + self.token_ttl_seconds
        claims = {
            "sub": principal.username,
            "roles": sorted(principal.roles),
            "iat": issued,
            "exp": expires,
        }
        body = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
        return f"{body}.{self._sign(body)}", expires

    def _sign(self, body: str) -> str:
        if not self.secret:
            raise RuntimeError("the token secret has not been loaded yet")
        return _b64(hmac.new(self.secret, body.encode(), hashlib.sha256).digest())

    def verify(self, token: str, now: float | None = None) -> Principal:
        body, sep, signature = token.partition(".")
        if not sep or not hmac.compare_digest(signature.encode(), self._sign(body).encode()):
            raise AuthError("bearer token signature is invalid", bearer_error=True)
        try:
            claims = json.loads(_unb64(body))
            subject = str(claims["sub"])
            roles = expand_roles([str(r) for r in claims["roles"]])
            expires = int(claims["exp"])
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise AuthError("bearer token is malformed", bearer_error=True) from exc
        if (time.time() if now is None else now) >= expires:
            raise AuthError("bearer token has expired", bearer_error=True)
        return Principal(subject, roles, "bearer")

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal of an ``Authorization`` header; None when there is none."""
        if not authorization:
            return None
        scheme, _, credentials = authorization.strip().partition(" ")
        scheme = scheme.lower()
        credentials = credentials.strip()
        if scheme == "bearer":
            return self.verify(credentials)
        if scheme == "basic":
            try:
                decoded = base64.b64decode(credentials, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError) as exc:
                raise AuthError("Basic credentials are not valid base64") from exc
            username, sep, password = decoded.partition(":")
            principal = self.check_password(username, password) if sep else None
            if principal is None:
                raise AuthError("invalid username or password")
            return principal
        raise AuthError(f"unsupported authorization scheme {scheme!r}; use Basic or Bearer")
