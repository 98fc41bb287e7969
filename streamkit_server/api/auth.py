"""``POST /coord/v1/auth/login``: trade the admin credentials for a bearer token."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from streamkit.protocol import API_PREFIX, LoginRequest, LoginResponse
from streamkit_server.api.deps import runtime
from streamkit_server.security import AuthError

router = APIRouter(prefix=API_PREFIX, tags=["Authentication"])


@router.post(
    "/auth/login",
    operation_id="loginCoordinatorApi",
    response_model=LoginResponse,
    responses={401: {"description": "Invalid credentials."}},
    openapi_extra={"security": []},
)
async def login(request: Request, body: LoginRequest | None = None) -> JSONResponse:
    auth = runtime(request).authenticator
    if body is not None and body.username is not None:
        principal = auth.check_password(body.username, body.password or "")
        if principal is None:
            raise AuthError("invalid username or password")
    else:
        # The body is optional in the contract: Basic credentials work too.
        principal = auth.authenticate(request.headers.get("authorization"))
        if principal is None or principal.method != "basic":
            raise AuthError("send username and password, or Basic credentials")
    token, expires = auth.issue(principal)
    response = LoginResponse(
        access_token=token,
        token_type="Bearer",
        expires_at=datetime.fromtimestamp(expires, tz=UTC),
        expires_in_seconds=auth.token_ttl_seconds,
        roles=sorted(principal.roles),
    )
    return JSONResponse(response.to_wire())
