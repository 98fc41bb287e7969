"""The endpoint -> role matrix, walked over real HTTP for every route and role.

Every route of the app (from the app itself, so a new route cannot be
forgotten) must be in ``access.ROUTE_ROLES``; without credentials a protected
route answers 401, with a principal lacking its role 403, never 200.  Also:
principals from settings log in with their hashed passwords, and a revoke
invalidates a principal's tokens on a second coordinator process.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import TEST_TOKEN_SECRET, CoordinatorProcess
from streamkit_server.api import create_app
from streamkit_server.auth.access import PUBLIC_PATHS, ROUTE_ROLES
from streamkit_server.auth.principals import hash_password, parse_principals, verify_password
from streamkit_server.auth.security import Authenticator, AuthError, Principal, Role
from streamkit_server.settings import ServerSettings

from ..sim import API

PASSWORDS = {"reader": "r-secret-7f3a", "writer": "w-secret-91bc", "member": "m-secret-c2d4"}
ROLES = {"reader": ["READ"], "writer": ["WRITE"], "member": ["MEMBER"]}
PRINCIPALS = json.dumps(
    [
        {"username": name, "passwordHash": hash_password(PASSWORDS[name]), "roles": ROLES[name]}
        for name in PASSWORDS
    ]
)
PATH_VALUES = {"streamPrefix": "orders", "consumerGroup": "billing", "reshardingId": "m-1",
               "username": "reader", "shard": "0", "shardId": "0", "memberId": "m-1"}  # fmt: skip


def _routes() -> list[tuple[str, str, str]]:
    """(key in the matrix, method, concrete path) for every route of the app."""
    app = create_app(ServerSettings(), admin_password="x", token_secret=b"x")
    out = []
    flat: list[object] = []
    for route in app.routes:
        # FastAPI nests included routers; their contexts name the real routes.
        contexts = getattr(route, "effective_route_contexts", None)
        flat.extend(c.original_route for c in contexts()) if contexts else flat.append(route)
    for route in flat:
        if isinstance(route, APIRoute) and route.include_in_schema:
            path = re.sub(r"{(\w+)}", lambda m: PATH_VALUES.get(m.group(1), "0"), route.path)
            out.extend((route.operation_id or route.path, method, path) for method in route.methods)
        elif getattr(route, "path", None) == "/metrics":
            out.append(("/metrics", "GET", "/metrics"))
        else:
            path = getattr(route, "path", "")
            assert path.startswith(PUBLIC_PATHS), f"{path} is neither public nor in the matrix"
    return out


ROUTES = _routes()


def test_every_route_is_in_the_matrix_and_the_matrix_has_no_leftovers() -> None:
    keys = {key for key, _, _ in ROUTES}
    assert keys == set(ROUTE_ROLES), keys ^ set(ROUTE_ROLES)


@pytest.fixture(scope="module")
def coord(redis_server: RedisServer) -> Iterator[CoordinatorProcess]:
    with CoordinatorProcess(
        redis_server.url, env={"STREAMKIT_SERVER_PRINCIPALS": PRINCIPALS}
    ) as proc:
        yield proc


async def test_every_route_refuses_missing_credentials_and_wrong_roles(
    coord: CoordinatorProcess,
) -> None:
    async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
        for key, method, path in ROUTES:
            role = ROUTE_ROLES[key]
            if role is None:
                continue
            anonymous = await http.request(method, path, json={})
            assert anonymous.status_code == 401, (key, anonymous.text)
            assert anonymous.json()["errorCode"] == "UNAUTHORIZED"
            for name in PASSWORDS:
                if role in {Role(r) for r in ROLES[name]}:
                    continue
                refused = await http.request(method, path, json={}, auth=(name, PASSWORDS[name]))
                assert refused.status_code == 403, (key, name, refused.text)
                assert refused.json()["errorCode"] == "FORBIDDEN"


def test_the_docs_show_the_same_matrix() -> None:
    text = (Path(__file__).parents[3] / "docs" / "operations.md").read_text()
    rows = dict(re.findall(r"^\| `([\w/]+)` \| (public|READ|WRITE|MEMBER) \|$", text, re.M))
    expected = {key: (role.value if role else "public") for key, role in ROUTE_ROLES.items()}
    assert rows == expected


def _auth(principals: dict[str, str], **extra: object) -> Authenticator:
    entries = parse_principals(
        json.dumps(
            [{"username": n, "passwordHash": h, "roles": ["READ"]} for n, h in principals.items()]
        )
    )
    return Authenticator("admin", "pw", b"s1", 60, principals=entries, **extra)  # type: ignore[arg-type]


def test_a_password_change_invalidates_tokens_and_a_previous_secret_still_verifies() -> None:
    stored = hash_password("one")
    old = _auth({"dash": stored})
    principal = old.check_password("dash", "one")
    assert principal is not None and principal.roles == {Role.READ}
    assert old.check_password("dash", "two") is None and old.check_password("nobody", "one") is None
    token, expires = old.issue(principal, version=3)
    assert old.verify(token).token_version == 3
    # A verified token is remembered, and still expires on time.
    assert old.verify(token) == old.verify(token, now=expires - 1)
    with pytest.raises(AuthError, match="expired"):
        old.verify(token, now=expires)
    with pytest.raises(AuthError, match="signature"):
        old.verify(token[:-2] + ("AA" if token[-2:] != "AA" else "BB"))
    with pytest.raises(AuthError):
        _auth({"dash": hash_password("two")}).verify(token)
    service = _auth({}).verify(token)  # not configured here: a service token, its own roles
    assert service.username == "dash" and service.roles == {Role.READ}
    assert _auth({"dash": stored}).verify(token).roles == {Role.READ}
    admin_token, _ = old.issue(Principal("admin", frozenset(Role), "basic"))
    rotated = _auth({}, previous_secrets=[b"s1"])
    rotated.secret = b"s2"
    assert rotated.verify(admin_token).roles == frozenset(Role)
    rotated.previous_secrets = ()
    with pytest.raises(AuthError, match="signature"):
        rotated.verify(admin_token)


async def test_revoke_and_secret_rotation_across_processes(
    coord: CoordinatorProcess, redis_server: RedisServer
) -> None:
    second = CoordinatorProcess(
        redis_server.url,
        token_secret="rotated-secret-5e1f",
        env={
            "STREAMKIT_SERVER_PRINCIPALS": PRINCIPALS,
            "STREAMKIT_SERVER_TOKEN_SECRET_PREVIOUS": TEST_TOKEN_SECRET,
        },
    )
    second.start()
    groups = f"{API}/monitoring/groups"
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            login = await http.post(
                f"{coord.url}{API}/auth/login",
                json={"username": "reader", "password": PASSWORDS["reader"]},
            )
            assert login.status_code == 200 and login.json()["roles"] == ["READ"]
            bearer = {"Authorization": f"Bearer {login.json()['accessToken']}"}
            # Signed with the old secret: still accepted by the rotated process.
            assert (await http.get(f"{second.url}{groups}", headers=bearer)).status_code == 200
            assert (await http.get(f"{coord.url}/metrics", headers=bearer)).status_code == 200
            # Repeated bearer requests find the token version in the process's cache.
            for _ in range(5):
                assert (await http.get(f"{coord.url}{groups}", headers=bearer)).status_code == 200
            metrics = (await http.get(f"{coord.url}/metrics", headers=bearer)).text
            cached = 'redis_stream_coord_token_version_reads_total{source="cache"}'
            assert any(
                line.startswith(cached) and float(line.split()[-1]) >= 1
                for line in metrics.splitlines()
            ), metrics
            # WRITE is needed to revoke; the reader may not revoke itself.
            path = f"{API}/admin/principals/reader/revoke-tokens"
            assert (await http.post(f"{coord.url}{path}", headers=bearer)).status_code == 403
            revoked = await http.post(f"{coord.url}{path}", auth=coord.admin_auth)
            assert revoked.status_code == 200, revoked.text
            for proc in (coord, second):
                refused = await http.get(f"{proc.url}{groups}", headers=bearer)
                assert refused.status_code == 401 and "revoked" in refused.json()["message"]
            missing = await http.post(
                f"{coord.url}{API}/admin/principals/nobody/revoke-tokens", auth=coord.admin_auth
            )
            assert missing.status_code == 404
            # A token of the rotated process is signed with the new secret only.
            fresh = await http.post(
                f"{second.url}{API}/auth/login", auth=("reader", PASSWORDS["reader"])
            )
            new_bearer = {"Authorization": f"Bearer {fresh.json()['accessToken']}"}
            assert (await http.get(f"{second.url}{groups}", headers=new_bearer)).status_code == 200
            assert (await http.get(f"{coord.url}{groups}", headers=new_bearer)).status_code == 401
            # The CLI revokes too, through Redis alone.
            cli = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "streamkit_server", "revoke-tokens", "reader",
                "--redis-url", redis_server.url, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, stderr = await asyncio.wait_for(cli.communicate(), 30)
            assert cli.returncode == 0, stderr
            assert (await http.get(f"{second.url}{groups}", headers=new_bearer)).status_code == 401
            assert (await http.get(f"{coord.url}/metrics")).status_code == 401
            assert (await http.get(f"{coord.url}/livez")).status_code == 204
            assert (await http.get(f"{coord.url}/readyz")).status_code == 204
    finally:
        second.cleanup()


def test_the_openapi_document_declares_400_error_response_not_422_validation() -> None:
    schema = create_app(ServerSettings(), admin_password="x", token_secret=b"x").openapi()
    assert "HTTPValidationError" not in json.dumps(schema)
    for item in schema["paths"].values():
        for operation in item.values():
            if operation.get("parameters") or operation.get("requestBody"):
                declared = operation["responses"]["400"]["content"]["application/json"]
                assert declared["schema"]["$ref"].endswith("/ErrorResponse"), operation


# Last in the module: it locks "member" out of logging in for a minute.
async def test_failed_logins_are_limited_audited_and_no_secret_reaches_the_log(
    coord: CoordinatorProcess,
) -> None:
    login = f"{API}/auth/login"
    async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
        good = await http.post(login, auth=("reader", PASSWORDS["reader"]))
        token = good.json()["accessToken"]
        used = await http.get(
            f"{API}/monitoring/groups", headers={"Authorization": f"Bearer {token}"}
        )
        assert used.status_code == 200
        statuses = []
        for _ in range(11):
            wrong = await http.post(login, json={"username": "member", "password": "guess-1234"})
            statuses.append(wrong.status_code)
        assert statuses == [401] * 10 + [429]
        assert int(wrong.headers["retry-after"]) >= 1
        assert wrong.json()["errorCode"] == "TOO_MANY_REQUESTS"
        # It says why, so whoever fixed the password knows why it is refused too.
        assert "too many failed logins as 'member'" in wrong.json()["message"]
        # Over the limit even the right password is refused, by Basic too.
        right = await http.post(login, json={"username": "member", "password": PASSWORDS["member"]})
        assert right.status_code == 429
        basic = await http.get(f"{API}/monitoring/groups", auth=("member", PASSWORDS["member"]))
        assert basic.status_code == 429
    log = coord.log_path.read_text()
    records = [json.loads(line.split("streamkit_server.audit: ", 1)[1])
               for line in log.splitlines() if "streamkit_server.audit: " in line]  # fmt: skip
    refused = [r for r in records if r["route"] == login and r["status"] == 429]
    assert refused and refused[-1]["kind"] == "refusal" and refused[-1]["bodySha256"]
    assert any(r["principalTried"] == "member" and r["status"] == 429 for r in records)
    assert any(r["status"] == 403 and r["principal"] == "reader" for r in records)
    for secret in (*PASSWORDS.values(), "guess-1234", TEST_TOKEN_SECRET, coord.admin_password,
                   token, token.split(".")[1]):  # fmt: skip
        assert secret not in log


def test_the_cli_hashes_a_password_for_a_principals_document() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "streamkit_server", "hash-password"],
        input="s3cret-pass\n", capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    stored = done.stdout.strip()
    assert verify_password("s3cret-pass", stored) and not verify_password("other", stored)
    assert "s3cret-pass" not in done.stdout + done.stderr
    entry = {"username": "u", "passwordHash": stored, "roles": ["ADMIN"]}
    assert parse_principals(json.dumps([entry]))["u"].roles == {"ADMIN"}
    with pytest.raises(ValueError, match="unknown roles"):
        parse_principals(json.dumps([{**entry, "roles": ["ROOT"]}]))
