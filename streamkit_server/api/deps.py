"""FastAPI dependencies: the runtime, authentication and validated group keys."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request

from streamkit_server.api.runtime import Runtime
from streamkit_server.errors import ApiError
from streamkit_server.provisioning import validate_consumer_group, validate_stream_prefix
from streamkit_server.security import AuthError, Principal, Role
from streamkit_server.store import GroupKeys

__all__ = ["group_keys", "optional_principal", "require", "require_member", "runtime"]


def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


def optional_principal(request: Request) -> Principal | None:
    """The caller, if it sent credentials (invalid ones still raise 401)."""
    return runtime(request).authenticator.authenticate(request.headers.get("authorization"))


def _check(request: Request, role: Role) -> Principal:
    principal = optional_principal(request)
    if principal is None:
        raise AuthError("authentication required (Basic or Bearer)")
    if role not in principal.roles:
        raise ApiError(403, "FORBIDDEN", f"{principal.username!r} lacks the {role} role")
    return principal


def require(role: Role) -> Callable[[Request], Awaitable[Principal]]:
    async def dependency(request: Request) -> Principal:
        return _check(request, role)

    return dependency


async def require_member(request: Request) -> Principal | None:
    # Closed unless the unsafe STREAMKIT_SERVER_INSECURE_MEMBER_API is on.
    if runtime(request).settings.insecure_member_api:
        return None
    return _check(request, Role.MEMBER)


def group_keys(request: Request, streamPrefix: str, consumerGroup: str) -> GroupKeys:
    validate_stream_prefix(streamPrefix)
    validate_consumer_group(consumerGroup)
    return runtime(request).service.keys(streamPrefix, consumerGroup)
