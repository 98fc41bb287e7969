"""Authentication and roles over real HTTP."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.security import Authenticator, Principal, Role

from .sim import API, SimMember, create_group

Factory = Callable[..., CoordinatorProcess]
SECRET = b"streamkit-test-token-secret"  # CoordinatorProcess's default token secret
GROUPS = f"{API}/monitoring/groups"


def _token(roles: list[str], *, now: float | None = None, secret: bytes = SECRET) -> str:
    auth = Authenticator("admin", "x", secret, 3600)
    principal = Principal("svc", frozenset(Role(r) for r in roles if r in Role.__members__), "t")
    token, _ = auth.issue(principal, now=now)
    return token


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_admin_and_monitoring_need_credentials(
    coordinator: CoordinatorProcess, any_redis: RedisTarget
) -> None:
    url = coordinator.url
    async with httpx.AsyncClient(base_url=url) as http:
        missing = await http.get(GROUPS)
        assert missing.status_code == 401
        assert missing.json()["errorCode"] == "UNAUTHORIZED"
        challenge = missing.headers["www-authenticate"]
        assert "Basic" in challenge and "Bearer" in challenge
        assert (await http.get(GROUPS, auth=("admin", "wrong"))).status_code == 401
        assert (await http.get(GROUPS, headers={"Authorization": "Basic !!"})).status_code == 401
        assert (await http.get(GROUPS, auth=coordinator.admin_auth)).status_code == 200

        login = await http.post(
            f"{API}/auth/login", json={"username": "admin", "password": coordinator.admin_password}
        )
        assert login.status_code == 200
        issued = login.json()
        assert issued["tokenType"] == "Bearer" and issued["expiresInSeconds"] == 7 * 24 * 3600
        assert set(issued["roles"]) == {"READ", "WRITE", "MEMBER"}
        assert (await http.get(GROUPS, headers=_bearer(issued["accessToken"]))).status_code == 200
        via_basic = await http.post(f"{API}/auth/login", auth=coordinator.admin_auth)
        assert via_basic.status_code == 200
        bad_login = await http.post(
            f"{API}/auth/login", json={"username": "admin", "password": "x"}
        )
        assert bad_login.status_code == 401 and bad_login.json()["status"] == "401"

        forged = issued["accessToken"][:-4] + (
            "AAAA" if issued["accessToken"][-4:] != "AAAA" else "BBBB"
        )
        for token in (forged, _token(["READ"], secret=b"other"), _token(["READ"], now=0), "junk"):
            rejected = await http.get(GROUPS, headers=_bearer(token))
            assert rejected.status_code == 401, token
            assert 'error="invalid_token"' in rejected.headers["www-authenticate"]

        reader = _bearer(_token(["READ"]))
        assert (await http.get(GROUPS, headers=reader)).status_code == 200
        denied = await http.post(f"{API}/streams/s1", json={"requestedBy": "t"}, headers=reader)
        assert denied.status_code == 403 and denied.json()["errorCode"] == "FORBIDDEN"

        session = (await http.get(f"{API}/monitoring/session")).json()
        assert session == {"authenticated": False, "username": None}
        session = (await http.get(f"{API}/monitoring/session", auth=coordinator.admin_auth)).json()
        assert session == {"authenticated": True, "username": "admin"}

        # The member API is open by default.
        await create_group(http, coordinator, "open", "g", 1)
        member = SimMember(http, url, "open", "g", "m1")
        assert (await member.heartbeat())["status"] == "OK"


async def test_member_api_protected_when_configured(
    any_redis: RedisTarget, coordinator_factory: Factory
) -> None:
    coord = coordinator_factory(any_redis, env={"STREAMKIT_SERVER_AUTHENTICATE_MEMBER_API": "true"})
    async with httpx.AsyncClient(base_url=coord.url) as http:
        await create_group(http, coord, "closed", "g", 1)
        member = SimMember(http, coord.url, "closed", "g", "m1")
        anonymous = await member.post(member.body())
        assert anonymous.status_code == 401
        http.headers.update(_bearer(_token(["READ"])))
        assert (await member.post(member.body())).status_code == 403
        http.headers.update(_bearer(_token(["MEMBER"])))
        assert (await member.heartbeat())["status"] == "OK"
        del http.headers["Authorization"]
        http.auth = coord.admin_auth  # the admin has MEMBER too
        assert (await member.heartbeat())["status"] == "OK"
