"""Login (credentials -> bearer token) and revoking a principal's tokens."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse

from streamkit.protocol import API_PREFIX, LoginRequest, LoginResponse
from streamkit_server.api.audit import audited
from streamkit_server.api.deps import AUTHORIZE, Caller, login_guard, runtime
from streamkit_server.api.errors import CALLER_ERRORS, documented
from streamkit_server.auth.security import AuthError
from streamkit_server.auth.token_versions import current_version
from streamkit_server.errors import ApiError

router = APIRouter(prefix=API_PREFIX, tags=["Authentication"], dependencies=[AUTHORIZE])

Username = Annotated[str, Path(min_length=1, max_length=128)]


@router.post(
    "/auth/login",
    operation_id="loginCoordinatorApi",
    response_model=LoginResponse,
    responses=documented({401: "Invalid credentials."}),
    openapi_extra={"security": []},
)
async def login(request: Request, body: LoginRequest | None = None) -> JSONResponse:
    rt = runtime(request)
    auth = rt.authenticator
    if body is not None and body.username is not None:
        await login_guard(request, body.username[:128], failed=False)
        principal = auth.check_password(body.username, body.password or "")
        if principal is None:
            await login_guard(request, body.username[:128], failed=True)
            raise AuthError("invalid username or password")
    else:
        # The body is optional in the contract: Basic credentials work too.
        principal = auth.authenticate(request.headers.get("authorization"))
        if principal is None or principal.method != "basic":
            raise AuthError("send username and password, or Basic credentials")
    version = await current_version(rt.client, rt.settings.key_prefix, principal.username)
    token, expires = auth.issue(principal, version=version)
    response = LoginResponse(
        access_token=token,
        token_type="Bearer",
        expires_at=datetime.fromtimestamp(expires, tz=UTC),
        expires_in_seconds=auth.token_ttl_seconds,
        roles=sorted(principal.roles),
    )
    return JSONResponse(response.to_wire())


_REVOKE_ERRORS = documented({**CALLER_ERRORS, 404: "No such principal."})


@router.post(
    "/admin/principals/{username}/revoke-tokens",
    operation_id="revokePrincipalTokens",
    responses=_REVOKE_ERRORS,
)
async def revoke_tokens(request: Request, username: Username, principal: Caller) -> JSONResponse:
    """Invalidate every token issued so far to ``username``, on every coordinator process."""
    rt = runtime(request)
    if rt.authenticator.roles_of(username) is None:
        raise ApiError(404, "NOT_FOUND", "no such principal")
    async with audited(request):
        version = await rt.token_versions.revoke(username)
    return JSONResponse({"username": username, "tokenVersion": version})
