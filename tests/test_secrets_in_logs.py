"""No secret reaches a log: a short end-to-end run at DEBUG, then a grep.

A coordinator (access log on), a ``streamkit run`` consumer process and a
publisher process talk to each other and to Redis through a password-protected
Redis ACL user; the test also logs in (bearer token), fails a login, sends
wrong Basic credentials and revokes a token, so the refusal paths log too.
Then every log of the run is searched for every secret the run used:
passwords, the Redis URL's password, the token secret, the token itself and
the Basic header.  None may appear.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from helpers import API, REPO, AppProcess, eventually

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.auth.principals import hash_password

pytestmark = pytest.mark.slow

REDIS_USER, REDIS_PASSWORD = "e2e-app", "e2e-redis-pw-91f0c3"
ADMIN_PASSWORD = "e2e-admin-pw-4d2a7b"
TOKEN_SECRET = "e2e-token-secret-8c1e55"
CONSUMER_PASSWORD = "e2e-consumer-pw-0b7f19"
PRODUCER_PASSWORD = "e2e-producer-pw-6a3d28"
WRONG_GUESS = "e2e-wrong-guess-5e9c40"
MESSAGES = 20

PRODUCER = """
import asyncio, logging, os, sys
from streamkit import Publisher
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)

async def main() -> None:
    async with Publisher(os.environ["SKT_PREFIX"], os.environ["SKT_GROUP"]) as publisher:
        for n in range(int(os.environ["SKT_COUNT"])):
            await publisher.publish(f"key-{n}", {"n": str(n)})
    print("published", flush=True)

asyncio.run(main())
"""


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    with redis_server.client() as conn:
        conn.execute_command(
            "ACL", "SETUSER", REDIS_USER, "reset", "on", f">{REDIS_PASSWORD}", "~*", "&*", "+@all"
        )
    try:
        yield redis_server.url.replace("redis://", f"redis://{REDIS_USER}:{REDIS_PASSWORD}@")
    finally:
        with redis_server.client() as conn:
            conn.execute_command("ACL", "DELUSER", REDIS_USER)


def _principals() -> str:
    return json.dumps(
        [
            {"username": "consumer", "passwordHash": hash_password(CONSUMER_PASSWORD),
             "roles": ["MEMBER", "READ"]},
            {"username": "producer", "passwordHash": hash_password(PRODUCER_PASSWORD),
             "roles": ["READ"]},
        ]
    )  # fmt: skip


def _client_env(
    coord: CoordinatorProcess, redis_url: str, user: str, password: str
) -> dict[str, str]:
    return {
        "STREAMKIT_COORDINATOR_URL": coord.url,
        "STREAMKIT_COORDINATOR_USERNAME": user,
        "STREAMKIT_COORDINATOR_PASSWORD": password,
        "STREAMKIT_REDIS_URL": redis_url,
    }


async def test_an_end_to_end_run_logs_no_secret(redis_url: str, tmp_path: Path) -> None:
    prefix, group = f"secrets-{uuid.uuid4().hex[:6]}", "billing"
    coord = CoordinatorProcess(
        redis_url,
        admin_password=ADMIN_PASSWORD,
        token_secret=TOKEN_SECRET,
        env={
            "STREAMKIT_SERVER_PRINCIPALS": _principals(),
            "STREAMKIT_SERVER_LOG_LEVEL": "debug",
            "STREAMKIT_SERVER_ACCESS_LOG": "true",
        },
    )
    consumer_env = _client_env(coord, redis_url, "consumer", CONSUMER_PASSWORD)
    consumer_env.update(
        STREAMKIT_MEMBER_ID_BASE="secrets", SKT_PREFIX=prefix, SKT_GROUP=group,
        SKT_RECORD=str(tmp_path / "consumer.rec"),
    )  # fmt: skip
    consumer = AppProcess(
        "tests.consumer.apps.recording:app", consumer_env, tmp_path / "consumer.log",
        args=("--log-level", "debug"),
    )  # fmt: skip
    producer_log = tmp_path / "producer.log"
    token = ""
    with coord:
        async with httpx.AsyncClient(base_url=coord.url, timeout=10) as http:
            created = await http.post(
                f"{API}/streams/{prefix}/groups/{group}",
                json={"initialShardCount": 2, "requestedBy": "secrets-test"},
                auth=("admin", ADMIN_PASSWORD),
            )
            assert created.status_code == 201, created.text
            consumer.start()
            try:
                login = await http.post(
                    f"{API}/auth/login",
                    json={"username": "consumer", "password": CONSUMER_PASSWORD},
                )
                token = login.json()["accessToken"]
                bearer = {"Authorization": f"Bearer {token}"}
                assert (
                    await http.get(f"{API}/monitoring/groups", headers=bearer)
                ).status_code == 200
                wrong = await http.post(
                    f"{API}/auth/login", json={"username": "consumer", "password": WRONG_GUESS}
                )
                assert wrong.status_code == 401
                basic = await http.get(f"{API}/monitoring/groups", auth=("producer", WRONG_GUESS))
                assert basic.status_code == 401
                revoked = await http.post(
                    f"{API}/admin/principals/consumer/revoke-tokens", auth=("admin", ADMIN_PASSWORD)
                )
                assert revoked.status_code == 200
                assert (
                    await http.get(f"{API}/monitoring/groups", headers=bearer)
                ).status_code == 401

                env = {**os.environ, **_client_env(coord, redis_url, "producer", PRODUCER_PASSWORD)}
                env.update(SKT_PREFIX=prefix, SKT_GROUP=group, SKT_COUNT=str(MESSAGES),
                           PYTHONPATH=str(REPO))  # fmt: skip
                with producer_log.open("wb") as out:
                    done = await anyio.to_thread.run_sync(
                        lambda: subprocess.run(
                            [sys.executable, "-c", PRODUCER],
                            env=env,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            timeout=60,
                            check=False,
                        )
                    )
                assert done.returncode == 0, producer_log.read_text()

                def handled() -> bool:
                    record = tmp_path / "consumer.rec"
                    lines = record.read_text().splitlines() if record.exists() else []
                    return sum(line.startswith("H ") for line in lines) >= MESSAGES

                await eventually(handled, 30, "the consumer handling every message",
                                 details=lambda: consumer.logs(None))  # fmt: skip
                assert await consumer.terminate(within=20) == 0, consumer.logs(None)
            finally:
                consumer.cleanup()
        # Read before the coordinator's directory goes away with it.
        logs = {
            "coordinator": coord.log_path.read_text(errors="replace"),
            "consumer": (tmp_path / "consumer.log").read_text(errors="replace"),
            "producer": producer_log.read_text(errors="replace"),
        }
    # The logs are real: each process logged its part of the run at DEBUG.
    assert "streamkit_server.audit" in logs["coordinator"] and " 401" in logs["coordinator"]
    assert "DEBUG" in logs["consumer"] and "left the group" in logs["consumer"]
    assert "DEBUG" in logs["producer"] and "published" in logs["producer"]
    secrets = {
        "Redis password": REDIS_PASSWORD,
        "admin password": ADMIN_PASSWORD,
        "token secret": TOKEN_SECRET,
        "consumer password": CONSUMER_PASSWORD,
        "producer password": PRODUCER_PASSWORD,
        "wrong password tried": WRONG_GUESS,
        "bearer token": token,
        "bearer token signature": token.rsplit(".", 1)[-1],
        "Basic header": base64.b64encode(f"consumer:{CONSUMER_PASSWORD}".encode()).decode(),
        "producer Basic header": base64.b64encode(
            f"producer:{PRODUCER_PASSWORD}".encode()
        ).decode(),
    }
    assert token
    leaks = [(what, where) for what, secret in secrets.items()
             for where, text in logs.items() if secret in text]  # fmt: skip
    assert not leaks, leaks
