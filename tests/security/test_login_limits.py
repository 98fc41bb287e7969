"""Login rate limits that cannot lock others out (issue 36, finding 4).

Failed logins are counted per (name tried, client address); a small global
backstop bounds guessing from many addresses without blocking a pair that
has not failed.  Clients come from distinct loopback addresses (127.0.0.x).
A failed check costs the same scrypt for known and unknown names.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from server.sim import API

from streamkit.testing.coordinator import CoordinatorProcess
from streamkit.testing.redis_server import RedisServer
from streamkit_server.auth.principals import PrincipalEntry, hash_password
from streamkit_server.auth.security import Authenticator

LOGIN = f"{API}/auth/login"
SVC_PASSWORD = "svc-password-1"


@pytest.fixture(scope="module")
def limited(redis_server: RedisServer) -> Iterator[CoordinatorProcess]:
    principals = [{"username": "svc", "passwordHash": hash_password(SVC_PASSWORD),
                   "roles": ["MEMBER"]}]  # fmt: skip
    with CoordinatorProcess(
        redis_server.url,
        env={
            "STREAMKIT_SERVER_PRINCIPALS": json.dumps(principals),
            "STREAMKIT_SERVER_LOGIN_FAILURES_PER_MINUTE": "3",
            "STREAMKIT_SERVER_LOGIN_FAILURES_BACKSTOP_PER_MINUTE": "8",
        },
    ) as proc:
        yield proc


@pytest.fixture
async def clean(limited: CoordinatorProcess, redis_server: RedisServer) -> AsyncIterator[None]:
    r = aioredis.from_url(redis_server.url)
    try:
        async for key in r.scan_iter(match="redis-stream:coord:ratelimit:login-*"):
            await r.delete(key)
        yield
    finally:
        await r.aclose()


def _from(address: str, coord: CoordinatorProcess) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(local_address=address)
    return httpx.AsyncClient(base_url=coord.url, transport=transport, timeout=10)


async def _login(http: httpx.AsyncClient, username: str, password: str) -> httpx.Response:
    return await http.post(LOGIN, json={"username": username, "password": password})


async def test_failures_lock_only_their_own_pair(limited: CoordinatorProcess, clean: None) -> None:
    async with _from("127.0.0.2", limited) as attacker, _from("127.0.0.3", limited) as svc:
        statuses = [(await _login(attacker, "svc", "wrong")).status_code for _ in range(6)]
        assert statuses == [401] * 3 + [429] * 3, statuses  # three failures, then locked
        refused = await _login(attacker, "svc", SVC_PASSWORD)
        assert refused.status_code == 429  # the attacker's own pair stays locked
        assert refused.json()["errorCode"] == "TOO_MANY_REQUESTS"
        # The real service, elsewhere: not locked out by the name's failures.
        assert (await _login(svc, "svc", SVC_PASSWORD)).status_code == 200
        # Behind the attacker's address (a proxy), other names still log in.
        assert (await _login(attacker, *limited.admin_auth)).status_code == 200
        basic = await attacker.get(f"{API}/monitoring/groups", auth=limited.admin_auth)
        assert basic.status_code == 200


async def test_the_backstop_blocks_failed_pairs_but_not_clean_ones(
    limited: CoordinatorProcess, clean: None
) -> None:
    async with _from("127.0.0.4", limited) as many, _from("127.0.0.5", limited) as svc:
        # Guessing across names from one address: each pair under its own limit,
        # together over the backstop (8).
        for i in range(9):
            assert (await _login(many, f"user{i}", "wrong")).status_code == 401
        again = await _login(many, "user0", "wrong")
        assert again.status_code == 429 and again.json()["errorCode"] == "TOO_MANY_REQUESTS"
        # A pair that has not failed is still checked: wrong is 401, right is 200.
        assert (await _login(many, "fresh", "wrong")).status_code == 401
        assert (await _login(svc, "svc", SVC_PASSWORD)).status_code == 200


def test_unknown_names_cost_what_known_ones_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every failed check runs one scrypt with the same parameters, known
    name or not (counted, not timed: a timing bound fails on a loaded machine)."""
    svc = PrincipalEntry("svc", hash_password(SVC_PASSWORD), frozenset({"MEMBER"}))
    auth = Authenticator("admin", "admin-password", b"k" * 32, 60, principals={"svc": svc})
    auth.check_password("nobody", "wrong")  # the dummy hash is made once, on first use
    runs: list[tuple[int, int, int]] = []
    real = hashlib.scrypt

    def counted(password: bytes, **kwargs: Any) -> bytes:
        runs.append((kwargs["n"], kwargs["r"], kwargs["p"]))
        return real(password, **kwargs)

    monkeypatch.setattr(hashlib, "scrypt", counted)
    costs = {}
    for username in ("svc", "nobody", "admin"):
        runs.clear()
        assert auth.check_password(username, "wrong") is None
        costs[username] = list(runs)
    # Before the fix an unknown name ran no scrypt at all (~30x cheaper).
    assert len(costs["svc"]) == 1
    assert costs["nobody"] == costs["svc"] == costs["admin"]
