"""Member credentials scoped to streams and groups (issue 36, item 1's second half).

A principal configured with ``groups: ["orders/*"]`` gets ``403`` on another
stream's heartbeat and routing, over Basic, over a bearer token (the fast
heartbeat path) and with the token's own claims; a principal without
patterns keeps reaching every group.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers import join_body
from server.sim import API, hb_path

from streamkit.testing.coordinator import CoordinatorProcess
from streamkit.testing.redis_server import RedisServer
from streamkit_server.auth.principals import hash_password, parse_principals
from streamkit_server.auth.scope import Scope

PASSWORD = "scoped-password-1"


@pytest.fixture(scope="module")
def scoped_redis() -> Iterator[RedisServer]:
    """A Redis of this module's own: a coordinator with production timings may
    not join the shared one, where the suite's coordinators use short ones."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def coord(scoped_redis: RedisServer) -> Iterator[CoordinatorProcess]:
    redis_server = scoped_redis
    hashed = hash_password(PASSWORD)
    principals = [
        {"username": "orders-svc", "passwordHash": hashed, "roles": ["MEMBER", "READ"],
         "groups": ["orders-*/*"]},
        {"username": "plain-svc", "passwordHash": hashed, "roles": ["MEMBER", "READ"]},
    ]  # fmt: skip
    with CoordinatorProcess(
        redis_server.url, env={"STREAMKIT_SERVER_PRINCIPALS": json.dumps(principals)}
    ) as proc:
        yield proc


def _join(member: str) -> dict[str, Any]:
    return join_body(member, requestId="r1")


async def _groups(coord: CoordinatorProcess) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:6]
    mine, theirs = f"orders-{tag}", f"payments-{tag}"
    async with httpx.AsyncClient(base_url=coord.url, auth=coord.admin_auth, timeout=10) as http:
        for prefix in (mine, theirs):
            answer = await http.post(
                f"{API}/streams/{prefix}/groups/billing",
                json={"initialShardCount": 1, "requestedBy": "t"},
            )
            assert answer.status_code == 201, answer.text
    return mine, theirs


def _forbidden(answer: httpx.Response) -> None:
    assert answer.status_code == 403, answer.text
    error = answer.json()
    assert error["errorCode"] == "FORBIDDEN" and error["status"] == "403"


async def _token(http: httpx.AsyncClient, username: str) -> str:
    answer = await http.post(f"{API}/auth/login", json={"username": username, "password": PASSWORD})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["accessToken"])


async def test_a_scoped_member_reaches_only_its_groups(coord: CoordinatorProcess) -> None:
    mine, theirs = await _groups(coord)
    async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
        token = await _token(http, "orders-svc")
        claims = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
        assert claims["groups"] == ["orders-*/*"]  # the token carries its scope
        for auth in (
            {"auth": ("orders-svc", PASSWORD)},
            {"headers": {"authorization": f"Bearer {token}"}},
        ):
            member = f"m-{uuid.uuid4().hex[:6]}"
            ok = await http.post(hb_path(mine, "billing", member), json=_join(member), **auth)
            assert ok.status_code == 200, ok.text
            _forbidden(await http.post(hb_path(theirs, "billing", member), json=_join(member),
                                       **auth))  # fmt: skip
            routing = f"{API}/streams/{{}}/groups/billing/producer-routing"
            assert (await http.get(routing.format(mine), **auth)).status_code == 200
            _forbidden(await http.get(routing.format(theirs), **auth))
            _forbidden(await http.get(f"{API}/monitoring/streams/{theirs}/groups/billing",
                                      **auth))  # fmt: skip


async def test_no_scope_is_every_group(coord: CoordinatorProcess) -> None:
    mine, theirs = await _groups(coord)
    async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
        token = await _token(http, "plain-svc")
        for prefix in (mine, theirs):
            member = f"m-{uuid.uuid4().hex[:6]}"
            answer = await http.post(
                hb_path(prefix, "billing", member), json=_join(member),
                headers={"authorization": f"Bearer {token}"},
            )  # fmt: skip
            assert answer.status_code == 200, answer.text


def test_scope_patterns() -> None:
    scope = Scope(groups=("orders/*", "billing"))
    assert scope.allows("orders", "a") and scope.allows("orders")
    assert scope.allows("payments", "billing")  # no '/': any stream's group "billing"
    assert not scope.allows("payments", "audit")
    assert not scope.allows("orders:x", "a")
    streams = Scope(streams=("orders*",), groups=("*/billing",))
    assert streams.allows("orders-eu", "billing") and not streams.allows("orders-eu", "x")
    assert not streams.allows("payments", "billing")
    assert Scope().allows("anything", "at-all")
    assert Scope.from_claims(Scope(streams=("a",)).claims()) == Scope(streams=("a",))


@pytest.mark.parametrize("bad", ['"orders/*"', "[1]", '[""]'])
def test_malformed_patterns_are_refused_at_start(bad: str) -> None:
    entry = {"username": "x", "passwordHash": hash_password("p"), "roles": ["MEMBER"]}
    text = json.dumps([entry])[:-2] + f', "groups": {bad}}}]'

    with pytest.raises(ValueError, match="groups"):
        parse_principals(text)
