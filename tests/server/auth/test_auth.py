"""Authentication and roles over real HTTP."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx
import pytest

from streamkit.coordinator_client import CoordinatorClient, CoordinatorError
from streamkit.testing import RedisTarget
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.auth.security import Authenticator, Principal, Role
from streamkit_server.auth.token_secret import token_secret_key

from ..sim import API, KEY_PREFIX, SimMember, create_group, redis_of

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
        assert issued["tokenType"] == "Bearer" and issued["expiresInSeconds"] == 3600
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

        # The member API needs a MEMBER principal by default.
        await create_group(http, coordinator, "closed", "g", 1)
        member = SimMember(http, url, "closed", "g", "m1", auth=None)
        anonymous = await member.post(member.body())
        assert anonymous.status_code == 401
        assert anonymous.json()["errorCode"] == "UNAUTHORIZED"
        assert "Bearer" in anonymous.headers["www-authenticate"]
        http.headers.update(_bearer(_token(["READ"])))
        assert (await member.post(member.body())).status_code == 403
        http.headers.update(_bearer(_token(["MEMBER"])))
        assert (await member.heartbeat())["status"] == "OK"
        del http.headers["Authorization"]
        http.auth = coordinator.admin_auth  # the admin has MEMBER too...
        # ...but m1 (no incarnation) is bound to "svc", who joined it: another
        # principal cannot report for it; a member of its own is fine.
        assert (await member.heartbeat())["status"] == "FENCED_MEMBER_EPOCH"
        own = SimMember(http, url, "closed", "g", "m2", auth=None)
        assert (await own.heartbeat())["status"] == "OK"


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_member_api_open_only_with_the_insecure_switch(
    any_redis: RedisTarget, coordinator_factory: Factory
) -> None:
    coord = coordinator_factory(any_redis, env={"STREAMKIT_SERVER_INSECURE_MEMBER_API": "true"})
    assert "INSECURE" in coord.logs() and "--insecure-member-api" in coord.logs()
    async with httpx.AsyncClient(base_url=coord.url) as http:
        await create_group(http, coord, "open", "g", 1)
        member = SimMember(http, coord.url, "open", "g", "m1", auth=None)
        assert (await member.heartbeat())["status"] == "OK"
        # Everything else still needs credentials.
        assert (await http.get(GROUPS)).status_code == 401


@pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)
async def test_coordinators_share_a_secret_through_redis_and_clients_survive_rotation(
    any_redis: RedisTarget, coordinator_factory: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    first = coordinator_factory(any_redis, token_secret=None)
    second = coordinator_factory(any_redis, token_secret=None)
    async with httpx.AsyncClient() as http:
        await create_group(http, first, "relogin", "g", 1)
        login = await http.post(f"{first.url}{API}/auth/login", auth=first.admin_auth)
        token = login.json()["accessToken"]
        for coord in (first, second):
            reply = await http.get(f"{coord.url}{GROUPS}", headers=_bearer(token))
            assert reply.status_code == 200, coord
        # A restart reads the same secret: the token survives it.
        await asyncio.to_thread(second.restart)
        reply = await http.get(f"{second.url}{GROUPS}", headers=_bearer(token))
        assert reply.status_code == 200

    user, password = second.member_auth
    async with CoordinatorClient(second.url, username=user, password=password) as client:
        assert (await client.get_group("relogin", "g")).shard_count == 1
        # Rotate the shared secret: every token issued so far is now refused,
        # and the client logs in again instead of failing.
        async with redis_of(any_redis) as r:
            assert await r.delete(token_secret_key(KEY_PREFIX)) == 1
        await asyncio.to_thread(second.restart)
        with caplog.at_level(logging.WARNING, logger="streamkit.coordinator"):
            assert (await client.get_group("relogin", "g")).shard_count == 1
        assert "logging in again" in caplog.text and "signature" in caplog.text
    async with CoordinatorClient(second.url, username=user, password="wrong") as client:
        with pytest.raises(CoordinatorError) as refused:
            await client.get_group("relogin", "g")
        assert refused.value.status_code == 401
