"""Authentication: Basic with the admin credentials, and signed bearer tokens.

Tokens are ``base64url(claims JSON) "." base64url(HMAC-SHA256(secret, first part))``
with claims ``sub``, ``roles``, ``iat``, ``exp`` (seconds), ``ver`` (the
principal's token version in Redis when issued: an explicit revoke bumps it,
see ``token_versions``) and ``cred`` (a fingerprint of the principal's stored
credential, so a password change invalidates older tokens).  Signatures are
checked in constant time against the current secret and any previous ones
(``STREAMKIT_SERVER_TOKEN_SECRET_PREVIOUS``) so rotation needs no downtime.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from streamkit_server.auth.principals import (
    PrincipalEntry,
    credential_fingerprint,
    hash_password,
    verify_password,
)
from streamkit_server.auth.scope import Scope

__all__ = [
    "ADMIN_ROLES",
    "AuthError",
    "Authenticator",
    "Principal",
    "Role",
    "basic_username",
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
_VERIFIED_CACHE: Final = 256
#: Bearer tokens verified recently; a fleet's members reuse one token each for
#: its lifetime, so this holds every member of a large fleet.
_TOKEN_CACHE: Final = 16_384


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
    # The per-principal version a bearer token was issued at (None for Basic).
    token_version: int | None = None
    #: Streams/groups it may name (auth/scope.py); every one must allow a request.
    scopes: tuple[Scope, ...] = ()

    def allows(self, stream_prefix: str, consumer_group: str | None = None) -> bool:
        return all(scope.allows(stream_prefix, consumer_group) for scope in self.scopes)


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


def _limited(scope: Scope) -> tuple[Scope, ...]:
    return () if scope.unlimited else (scope,)


@functools.cache
def _dummy_hash() -> str:
    # Same scrypt parameters as ``hash_password``; made once, on first use.
    return hash_password(secrets.token_urlsafe(16))


class Authenticator:
    """Passwords (bootstrap admin + configured principals) and signed tokens.

    Token version checks need Redis, so they live in ``api.deps``; this class
    stays pure: it signs, verifies signatures, expiry and credential
    fingerprints, and answers who a username is.
    """

    def __init__(
        self,
        admin_username: str,
        admin_password: str,
        secret: bytes | None,
        token_ttl_seconds: int,
        *,
        principals: Mapping[str, PrincipalEntry] | None = None,
        previous_secrets: Sequence[bytes] = (),
    ) -> None:
        self._user = admin_username.encode()
        self._password = admin_password.encode()
        self.admin_username = admin_username
        # None until the runtime has read the shared secret from Redis.
        self.secret = secret
        # Accepted for verification only, so a rotation needs no downtime:
        # tokens signed with the old secret keep working until they expire.
        self.previous_secrets = tuple(previous_secrets)
        self.token_ttl_seconds = token_ttl_seconds
        self.principals = dict(principals or {})
        if admin_username in self.principals:
            raise ValueError(f"principal {admin_username!r} is also the bootstrap admin")
        self._admin_cred = credential_fingerprint("admin:" + admin_password)
        # (username, sha256(password)) of recent good Basic checks: scrypt on
        # every Basic heartbeat would cost tens of milliseconds of CPU each.
        self._verified: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        # (token, secrets) -> (principal, expiry) of tokens that passed every
        # check: the signature, claims and credential checks are a pure function
        # of these, and cost more than the rest of a heartbeat's authentication.
        self._tokens: dict[tuple[str, bytes | None, tuple[bytes, ...]], tuple[Principal, int]] = {}

    def _fingerprint(self, username: str) -> str | None:
        if username == self.admin_username:
            return self._admin_cred
        entry = self.principals.get(username)
        return credential_fingerprint(entry.password_hash) if entry is not None else None

    def roles_of(self, username: str) -> frozenset[Role] | None:
        if username == self.admin_username:
            return ADMIN_ROLES
        entry = self.principals.get(username)
        return expand_roles(entry.roles) if entry is not None else None

    def check_password(self, username: str, password: str) -> Principal | None:
        entry = self.principals.get(username)
        if entry is None:
            # Both comparisons always run so timing does not reveal which one failed.
            user_ok = hmac.compare_digest(username.encode(), self._user)
            pass_ok = hmac.compare_digest(password.encode(), self._password)
            if user_ok and pass_ok:
                return Principal(self.admin_username, ADMIN_ROLES, "basic")
            # An unknown name (or the admin's with a wrong password) costs what a
            # configured principal's check costs: timing does not tell which exist.
            verify_password(password, _dummy_hash())
            return None
        key = (username, hashlib.sha256(entry.password_hash.encode() + password.encode()).digest())
        if key in self._verified:
            self._verified.move_to_end(key)
        elif verify_password(password, entry.password_hash):
            self._verified[key] = None
            if len(self._verified) > _VERIFIED_CACHE:
                self._verified.popitem(last=False)
        else:
            return None
        return Principal(username, expand_roles(entry.roles), "basic", scopes=_limited(entry.scope))

    def issue(
        self, principal: Principal, now: float | None = None, *, version: int = 0
    ) -> tuple[str, int]:
        """A signed token for ``principal``; returns (token, expiry in epoch seconds)."""
        issued = int(time.time() if now is None else now)
        expires = issued + self.token_ttl_seconds
        claims = {
            "sub": principal.username,
            "roles": sorted(principal.roles),
            "iat": issued,
            "exp": expires,
            "ver": version,
            "cred": self._fingerprint(principal.username) or "",
        }
        for scope in principal.scopes[:1]:  # a login's principal has its settings' scope
            claims.update(scope.claims())
        body = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
        return f"{body}.{self._sign(body)}", expires

    def _sign(self, body: str, secret: bytes | None = None) -> str:
        key = secret if secret is not None else self.secret
        if not key:
            raise RuntimeError("the token secret has not been loaded yet")
        return _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())

    def _signed(self, body: str, signature: str) -> bool:
        ok = False
        for secret in (self.secret, *self.previous_secrets):
            # No short-circuit: every configured secret is always tried.
            ok |= hmac.compare_digest(signature.encode(), self._sign(body, secret).encode())
        return ok

    def verify(self, token: str, now: float | None = None) -> Principal:
        """Signature, expiry and credential checks; the caller checks ``token_version``."""
        key = (token, self.secret, self.previous_secrets)
        known = self._tokens.get(key)
        if known is None:
            principal, expires = self._verify(token, now)
            if len(self._tokens) >= _TOKEN_CACHE:
                del self._tokens[next(iter(self._tokens))]  # the oldest entry
            self._tokens[key] = (principal, expires)
            return principal
        principal, expires = known
        if (time.time() if now is None else now) >= expires:
            del self._tokens[key]
            raise AuthError("bearer token has expired", bearer_error=True)
        return principal

    def _verify(self, token: str, now: float | None) -> tuple[Principal, int]:
        body, sep, signature = token.partition(".")
        if not sep or not self._signed(body, signature):
            raise AuthError("bearer token signature is invalid", bearer_error=True)
        try:
            claims = json.loads(_unb64(body))
            subject = str(claims["sub"])
            roles = expand_roles([str(r) for r in claims["roles"]])
            expires = int(claims["exp"])
            version = int(claims.get("ver", 0))
            cred = str(claims.get("cred", ""))
            carried = Scope.from_claims(claims)
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
            raise AuthError("bearer token is malformed", bearer_error=True) from exc
        if (time.time() if now is None else now) >= expires:
            raise AuthError("bearer token has expired", bearer_error=True)
        current = self.roles_of(subject)
        expected = self._fingerprint(subject)
        if current is None or expected is None:
            # A service token minted with the secret for a name not configured
            # here: it carries its own roles (revocable by name all the same).
            return Principal(subject, roles, "bearer", version, _limited(carried)), expires
        if not hmac.compare_digest(cred, expected):
            # The password changed since issue: the token is stale.
            raise AuthError("bearer token is no longer valid; log in again", bearer_error=True)
        # Roles removed from the principal since issue are gone from its tokens too;
        # a scope set since applies to them as well.
        entry = self.principals.get(subject)
        scopes = _limited(carried) + (_limited(entry.scope) if entry is not None else ())
        return Principal(subject, roles & current, "bearer", version, scopes), expires

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
        raise AuthError("unsupported authorization scheme; use Basic or Bearer")


def basic_username(authorization: str | None) -> str | None:
    """The username a Basic header tried (for audit), never the password."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.partition(":")[0][:128] or None
