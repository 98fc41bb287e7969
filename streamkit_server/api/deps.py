"""FastAPI dependencies: the runtime, authentication and validated group keys."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.routing import APIRoute

from streamkit.protocol import HeartbeatRequest
from streamkit_server.auth.access import required_role
from streamkit_server.auth.ratelimit import RateLimited
from streamkit_server.auth.security import AuthError, Principal, Role, basic_username
from streamkit_server.errors import ApiError
from streamkit_server.runtime import Runtime
from streamkit_server.store.keys import GroupKeys
from streamkit_server.store.provisioning import validate_group_names

__all__ = [
    "AUTHORIZE",
    "Caller",
    "authorize",
    "authorize_as",
    "check_role",
    "check_scope",
    "group_keys",
    "login_guard",
    "optional_principal",
    "rate_limit_member",
    "route_key",
    "runtime",
    "valid_keys",
    "verified_principal",
]


def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


_MINUTE_MS = 60_000


def _client_address(request: Request) -> str:
    return request.client.host if request.client else "-"


def _pair(request: Request, username: str) -> str:
    # Hashed: a bounded, printable key part whatever name or address was sent.
    tried = f"{_client_address(request)}\x00{username}".encode()
    return hashlib.sha256(tried).hexdigest()[:32]


@contextlib.asynccontextmanager
async def _told_why(username: str | None) -> AsyncIterator[None]:
    """A pair over its limit learns that its failed logins are the cause: the
    right password is refused too until the window passes, which is otherwise
    a mystery to whoever just fixed a typo."""
    try:
        yield
    except RateLimited as over:
        raise RateLimited(
            f"too many failed logins as {(username or '')[:64]!r} from this address in the "
            f"last minute (a wrong password?); this name may log in from here again in "
            f"{over.retry_after_s} s",
            over.retry_after_s,
        ) from None


async def login_guard(request: Request, username: str | None, *, failed: bool) -> None:
    """Look at (``failed``: count) failed logins; 429 when the caller's own are too many.

    Counted per (name tried, client address) pair, so neither a flood of
    wrong passwords for a name nor one address behind which many clients sit
    (a proxy) locks anyone else out.  A global backstop bounds guessing from
    many addresses: above it, only pairs with no failure in the window are
    still checked, so a client that has not failed still logs in.
    """
    rt = runtime(request)
    limiter = rt.limiter
    if limiter is None:
        return
    settings = rt.settings
    pair = _pair(request, username or "")
    if failed:
        async with _told_why(username):
            await limiter.check("login-pair", pair, window_ms=_MINUTE_MS,
                                limit=settings.login_failures_per_minute)  # fmt: skip
        with contextlib.suppress(RateLimited):  # counted; the pair rule decides
            await limiter.check("login-all", "failures", window_ms=_MINUTE_MS,
                                limit=settings.login_failures_backstop_per_minute)  # fmt: skip
        return
    async with _told_why(username):
        await limiter.check("login-pair", pair, window_ms=_MINUTE_MS,
                            limit=settings.login_failures_per_minute, cost=0)  # fmt: skip
    try:
        await limiter.check("login-all", "failures", window_ms=_MINUTE_MS,
                            limit=settings.login_failures_backstop_per_minute, cost=0)  # fmt: skip
    except RateLimited as over:
        # Under attack from many addresses: a pair that has failed waits.
        if await limiter.peek("login-pair", pair) > 0:
            raise RateLimited(
                "too many failed logins on this coordinator; this name and address may "
                f"try again in {over.retry_after_s} s",
                over.retry_after_s,
            ) from None


async def optional_principal(request: Request, rt: Runtime | None = None) -> Principal | None:
    """The caller, if it sent credentials (invalid or revoked ones still raise 401)."""
    rt = rt or runtime(request)
    header = request.headers.get("authorization")
    tried = basic_username(header)
    if tried is not None:
        await login_guard(request, tried, failed=False)
    try:
        principal = await verified_principal(rt, header)
    except AuthError:
        if tried is not None:
            await login_guard(request, tried, failed=True)
        raise
    if principal is not None:
        request.state.principal = principal
    return principal


async def verified_principal(rt: Runtime, authorization: str | None) -> Principal | None:
    """The principal of an ``Authorization`` header; AuthError if invalid or revoked."""
    principal = rt.authenticator.authenticate(authorization)
    if principal is not None and principal.token_version is not None:
        # Cached, kept honest by Redis's invalidation pushes (token_versions.py):
        # a revoke is seen by every process at once, without a read per request.
        version = await rt.token_versions.current(principal.username)
        if principal.token_version != version:
            raise AuthError("bearer token has been revoked; log in again", bearer_error=True)
    return principal


async def check_role(request: Request, role: Role, rt: Runtime | None = None) -> Principal:
    principal = await optional_principal(request, rt)
    if principal is None:
        raise AuthError("authentication required (Basic or Bearer)")
    if role not in principal.roles:
        raise ApiError(403, "FORBIDDEN", f"{principal.username!r} lacks the {role} role")
    return principal


def route_key(request: Request) -> str:
    route = request.scope.get("route")
    if isinstance(route, APIRoute) and route.operation_id:
        return route.operation_id
    return request.url.path


def check_scope(principal: Principal | None, prefix: str | None, group: str | None) -> None:
    """403 when ``principal``'s scope (auth/scope.py) does not cover the stream/group named."""
    if principal is None or not principal.scopes or prefix is None:
        return
    if not principal.allows(prefix, group):
        named = f"stream {prefix!r}" + (f", group {group!r}" if group is not None else "")
        raise ApiError(403, "FORBIDDEN", f"{principal.username!r} is not allowed on {named}")


async def authorize(request: Request) -> Principal | None:
    """The caller, checked against ``access.ROUTE_ROLES`` and its scope for the current route."""
    params = request.path_params
    prefix, group = params.get("streamPrefix"), params.get("consumerGroup")
    role = required_role(route_key(request))
    return await authorize_as(request, runtime(request), role, prefix, group)


async def authorize_as(
    request: Request, rt: Runtime, role: Role | None, prefix: str | None, group: str | None
) -> Principal | None:
    """``authorize`` for a route that knows its role and names (the heartbeat's handler)."""
    if role is None:
        principal = await optional_principal(request, rt)
        check_scope(principal, prefix, group)
        return principal
    if role is Role.MEMBER and rt.settings.insecure_member_api:
        # The unsafe STREAMKIT_SERVER_INSECURE_MEMBER_API switch (warned at start-up).
        return None
    principal = await check_role(request, role, rt)
    check_scope(principal, prefix, group)
    await _rate_limit(rt, role, principal, prefix, group)
    return principal


async def _rate_limit(
    rt: Runtime, role: Role, principal: Principal, prefix: str | None, group: str | None
) -> None:
    if rt.limiter is None:
        return
    settings = rt.settings
    if role is Role.WRITE:
        await rt.limiter.check(
            "admin", principal.username, window_ms=_MINUTE_MS,
            limit=settings.admin_mutations_per_minute,
        )  # fmt: skip
    elif role is Role.MEMBER:
        await rate_limit_member(rt, prefix or "", group or "")


async def rate_limit_member(rt: Runtime, prefix: str, group: str) -> None:
    """Count a heartbeat against its group's limit (RateLimited when over)."""
    if rt.limiter is None:
        return
    settings = rt.settings
    # Valid names only: a counter key per invalid name would be client-chosen.
    validate_group_names(prefix, group)
    # Batched: the fleet-wide count is shared in batches (about once a second
    # far from the limit), not one round trip per heartbeat (check_batched).
    await rt.limiter.check_batched(
        "heartbeat", f"{prefix}/{group}", window_ms=settings.heartbeat_interval_ms,
        limit=settings.heartbeat_rate_multiple * settings.max_members_per_group,
    )  # fmt: skip


async def rate_limit_join(rt: Runtime, principal: str | None, body: HeartbeatRequest) -> None:
    """Count a join (``memberEpoch`` 0) against its principal's limit.

    Departed member records no longer block joins (``core.limits``), but
    every join still writes a record and rebalances the group: a credential
    that joins with fresh member ids in a loop is slowed to this rate.
    Batched like the heartbeat limit: no round trip per join.
    """
    if rt.limiter is None or principal is None or body.member_epoch != 0:
        return
    await rt.limiter.check_batched(
        "join", principal, window_ms=_MINUTE_MS, limit=rt.settings.joins_per_minute
    )


async def _caller(request: Request) -> Principal:
    # A coroutine: FastAPI runs a plain ``def`` dependency in a worker thread,
    # a thread hop per request that costs more than this lookup.
    # ``authorize`` already ran as the router's dependency (before any
    # parameter is validated, so a caller without credentials gets 401 first).
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is None:  # only public routes and the insecure member switch
        return Principal("anonymous", frozenset(), "none")
    return principal


# Every router has ``dependencies=[AUTHORIZE]``; which role a route needs is in
# access.py.  Handlers that need the caller take ``Caller``.
AUTHORIZE = Depends(authorize)
Caller = Annotated[Principal, Depends(_caller)]


async def group_keys(request: Request, streamPrefix: str, consumerGroup: str) -> GroupKeys:
    """The group's Redis keys, names validated (a coroutine: no worker-thread hop)."""
    return keys_for(request, streamPrefix, consumerGroup)


def keys_for(request: Request, streamPrefix: str, consumerGroup: str) -> GroupKeys:
    return valid_keys(runtime(request), streamPrefix, consumerGroup)


def valid_keys(rt: Runtime, prefix: str, group: str) -> GroupKeys:
    """The group's Redis keys, once its names are valid (``Rejected`` if not)."""
    validate_group_names(prefix, group)
    return rt.service.keys(prefix, group)
