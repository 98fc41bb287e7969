"""Launch: settings from env and flags, fail-fast start-up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streamkit.testing import free_port
from streamkit_server.cli import parse_settings
from streamkit_server.core import CoordinatorConfig
from streamkit_server.settings import ServerSettings

ENV_NAMES = {
    "host": ("STREAMKIT_SERVER_HOST", "0.0.0.0", "0.0.0.0"),
    "port": ("STREAMKIT_SERVER_PORT", "9999", 9999),
    "redis_url": ("STREAMKIT_SERVER_REDIS_URL", "redis://h:1/2", "redis://h:1/2"),
    "redis_cluster": ("STREAMKIT_SERVER_REDIS_CLUSTER", "true", True),
    "admin_username": ("STREAMKIT_SERVER_ADMIN_USERNAME", "root", "root"),
    "key_prefix": ("STREAMKIT_SERVER_KEY_PREFIX", "kp", "kp"),
    "heartbeat_interval_ms": ("STREAMKIT_SERVER_HEARTBEAT_INTERVAL_MS", "100", 100),
    "member_lease_ttl_ms": ("STREAMKIT_SERVER_MEMBER_LEASE_TTL_MS", "1000", 1000),
    "rebalance_timeout_ms": ("STREAMKIT_SERVER_REBALANCE_TIMEOUT_MS", "2000", 2000),
    "tick_interval_ms": ("STREAMKIT_SERVER_TICK_INTERVAL_MS", "50", 50),
    "default_shard_count": ("STREAMKIT_SERVER_DEFAULT_SHARD_COUNT", "8", 8),
    "insecure_member_api": ("STREAMKIT_SERVER_INSECURE_MEMBER_API", "true", True),
}


def test_defaults() -> None:
    s = ServerSettings(_env_file=None)  # type: ignore[call-arg]
    assert (s.host, s.port, s.redis_url, s.redis_cluster) == (
        "127.0.0.1", 8080, "redis://127.0.0.1:6379/0", False,
    )  # fmt: skip
    assert (s.admin_username, s.admin_password, s.key_prefix) == (
        "admin",
        None,
        "redis-stream:coord",
    )
    assert (s.heartbeat_interval_ms, s.member_lease_ttl_ms, s.rebalance_timeout_ms) == (
        3000, 15000, 60000,
    )  # fmt: skip
    assert (s.tick_interval_ms, s.default_shard_count, s.insecure_member_api) == (
        1000,
        4,
        False,
    )
    assert s.token_secret is None


def test_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, raw, _ in ENV_NAMES.values():
        monkeypatch.setenv(env, raw)
    monkeypatch.setenv("STREAMKIT_SERVER_ADMIN_PASSWORD", "pw")
    monkeypatch.setenv("STREAMKIT_SERVER_TOKEN_SECRET", "sec")
    settings = ServerSettings()
    for field, (_, _, value) in ENV_NAMES.items():
        assert getattr(settings, field) == value, field
    assert settings.admin_password is not None
    assert settings.admin_password.get_secret_value() == "pw"


def test_every_setting_is_a_flag_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMKIT_SERVER_REDIS_URL", "redis://env:1/0")
    settings = parse_settings(
        ["--redis-url", "redis://flag:2/0", "--redis-cluster", "--port", "1234",
         "--insecure-member-api=false", "--member-lease-ttl-ms", "9000"]
    )  # fmt: skip
    assert settings.redis_url == "redis://flag:2/0"
    assert settings.redis_cluster is True and settings.port == 1234
    assert settings.insecure_member_api is False and settings.member_lease_ttl_ms == 9000


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamkit_server", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_unreachable_redis_fails_fast_with_one_line() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    result = _run("--redis-url", dead, STREAMKIT_SERVER_ADMIN_PASSWORD="pw",
                  STREAMKIT_SERVER_TOKEN_SECRET="s")  # fmt: skip
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if "cannot start" in line]
    assert len(lines) == 1 and dead in lines[0] and "unreachable" in lines[0]
    assert "Traceback" not in result.stderr


def test_the_redis_password_never_appears_in_the_start_error() -> None:
    port = free_port()
    url = f"redis://app:s3cret-pw@127.0.0.1:{port}/0"
    result = _run(
        "--redis-url", url, STREAMKIT_SERVER_ADMIN_PASSWORD="pw", STREAMKIT_SERVER_TOKEN_SECRET="s"
    )
    assert result.returncode == 1
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert f"redis://app:***@127.0.0.1:{port}/0" in result.stderr


def test_invalid_setting_fails_with_one_line() -> None:
    result = _run("--heartbeat-interval-ms", "5000", "--member-lease-ttl-ms", "6000")
    assert result.returncode == 2
    assert "member_lease_ttl_ms" in result.stderr and "Traceback" not in result.stderr


def test_a_rebalance_timeout_members_cannot_meet_is_refused() -> None:
    # 10 s heartbeats with a 10 s timeout: a member hears of its revocation
    # at the deadline and was fenced on every heartbeat (seen in a benchmark).
    timings = {"heartbeat_interval_ms": 10_000, "member_lease_ttl_ms": 30_000}
    with pytest.raises(ValueError, match="rebalance_timeout_ms must be at least twice"):
        ServerSettings(_env_file=None, rebalance_timeout_ms=19_999, **timings)  # type: ignore[call-arg]
    accepted = ServerSettings(_env_file=None, rebalance_timeout_ms=20_000, **timings)  # type: ignore[call-arg]
    assert accepted.coordinator_config().rebalance_timeout_ms == 20_000


def test_the_core_gets_every_tunable_the_settings_expose() -> None:
    # The settings default to the core's defaults and hand each value over by name.
    assert ServerSettings(_env_file=None).coordinator_config() == CoordinatorConfig()  # type: ignore[call-arg]
    tuned = {
        "heartbeat_interval_ms": 1_000,
        "member_lease_ttl_ms": 5_000,
        "rebalance_timeout_ms": 7_000,
        "producer_routing_lease_ms": 9_000,
        "max_members_per_group": 17,
    }
    config = ServerSettings(_env_file=None, **tuned).coordinator_config()  # type: ignore[call-arg]
    assert config == CoordinatorConfig(**tuned)


@pytest.mark.parametrize(
    ("name", "value"),
    [("ADMIN_PASSWORD", ""), ("ADMIN_PASSWORD", "  \t"), ("TOKEN_SECRET", " "),
     ("ADMIN_USERNAME", " ")],
)  # fmt: skip
def test_blank_credentials_are_refused_at_start(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"STREAMKIT_SERVER_{name}"):
        ServerSettings(**{name.lower(): value})


def test_blank_secret_fails_start_with_one_clear_line() -> None:
    result = _run(STREAMKIT_SERVER_ADMIN_PASSWORD=" ")
    assert result.returncode == 2
    assert "STREAMKIT_SERVER_ADMIN_PASSWORD is empty or blank" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_parts_start_creates_are_an_error_before_it() -> None:
    from streamkit_server.runtime import Runtime

    runtime = Runtime(ServerSettings(_env_file=None), "admin-password", None)  # type: ignore[call-arg]
    for part in ("client", "token_versions", "service", "resharding", "dead_letters"):
        with pytest.raises(RuntimeError, match="has not been started"):
            getattr(runtime, part)
