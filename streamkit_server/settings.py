"""Server settings: environment variables ``STREAMKIT_SERVER_*``, each also a CLI flag.

Secrets without a configured value are generated at start-up (see ``cli``),
never defaulted to a well-known string; an empty or blank one is refused,
because it would look configured while protecting nothing.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streamkit.numerals import ascii_uint
from streamkit_server.core import MAX_SHARD_COUNT, CoordinatorConfig
from streamkit_server.principals import PrincipalEntry, parse_principals

__all__ = ["ServerSettings"]


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STREAMKIT_SERVER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    redis_url: str = "redis://127.0.0.1:6379/0"
    # True: redis-py RedisCluster with the URL as a start-up node.
    redis_cluster: bool = False
    admin_username: str = Field(default="admin", min_length=1)
    # None: a random password is generated and printed once at start-up.
    admin_password: SecretStr | None = None
    # None: a random secret created once in Redis (SET NX) and shared by every
    # coordinator process on that Redis, so their tokens are interchangeable.
    token_secret: SecretStr | None = None
    # Accepted (never used to sign) so a secret rotation needs no downtime:
    # set the new TOKEN_SECRET with the old one here, drop it after one TTL.
    token_secret_previous: SecretStr | None = None
    # Short-lived: clients log in again on a 401 (see streamkit.coordinator_client).
    token_ttl_seconds: int = Field(default=3600, ge=1)
    # Principals besides the bootstrap admin: a JSON list of
    # {"username", "passwordHash", "roles"} inline, or in a file (see principals).
    principals: str | None = None
    principals_file: str | None = None
    key_prefix: str = Field(default="redis-stream:coord", min_length=1)
    heartbeat_interval_ms: int = Field(default=3_000, ge=1)
    member_lease_ttl_ms: int = Field(default=15_000, ge=1)
    rebalance_timeout_ms: int = Field(default=60_000, ge=1)
    tick_interval_ms: int = Field(default=1_000, ge=1)
    # The longest routing lease any producer uses (STREAMKIT_ROUTING_LEASE on
    # the clients, in seconds there): a removed shard is proven drained only
    # after this much time has passed since the layout switched.
    producer_routing_lease_ms: int = Field(default=30_000, ge=0)
    default_shard_count: int = Field(default=4, ge=1, le=MAX_SHARD_COUNT)
    # A join that would exceed it is refused with 400 TOO_MANY_MEMBERS.
    max_members_per_group: int = Field(default=1_024, ge=1, le=65_536)
    # The member API (heartbeats) needs a MEMBER principal unless this unsafe
    # switch is on; meant for local development only (a warning is logged).
    insecure_member_api: bool = False
    # Group mutex: how long a holder may keep it (crash safety) and how long a
    # request waits for it before answering RETRY.
    mutex_ttl_ms: int = Field(default=5_000, ge=100)
    mutex_wait_ms: int = Field(default=2_000, ge=1)
    # Request bodies above this are answered 413 before they are parsed.
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    # After SIGTERM: how long the process keeps answering 503
    # COORDINATOR_TERMINATING (so clients on open connections move to another
    # coordinator) before it closes its listener and exits.
    shutdown_grace_ms: int = Field(default=1_000, ge=0)
    # Rate limits (0 turns one off), shared by every process through Redis.
    # Failed logins (login endpoint and Basic credentials) per minute, per
    # username tried and per client address: brute force, never a healthy fleet.
    login_failures_per_minute: int = Field(default=10, ge=0)
    login_failures_per_client_per_minute: int = Field(default=30, ge=0)
    # Admin mutations (WRITE routes) per principal per minute.
    admin_mutations_per_minute: int = Field(default=600, ge=0)
    # Heartbeats per group per heartbeat interval, as a multiple of the most
    # members a group may have: each member sends one per interval.
    heartbeat_rate_multiple: int = Field(default=10, ge=0)
    # Also copy every audit record to this Redis stream (a key name; None:
    # log only), trimmed to about AUDIT_STREAM_MAXLEN entries.  Written off
    # the request path: a Redis error never fails a request.
    audit_stream: str | None = Field(default=None, min_length=1)
    audit_stream_maxlen: int = Field(default=100_000, ge=1)
    # "host:port" of a second listener serving only /metrics, without
    # credentials; loopback addresses only (a sidecar or node agent scrapes it).
    metrics_listen: str | None = None
    log_level: str = "info"
    access_log: bool = False

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        if not self.admin_username.strip():
            raise ValueError("STREAMKIT_SERVER_ADMIN_USERNAME must not be blank")
        for name, secret in (("ADMIN_PASSWORD", self.admin_password),
                             ("TOKEN_SECRET", self.token_secret),
                             ("TOKEN_SECRET_PREVIOUS", self.token_secret_previous)):  # fmt: skip
            if secret is not None and not secret.get_secret_value().strip():
                raise ValueError(
                    f"STREAMKIT_SERVER_{name} is empty or blank; unset it to have one "
                    "generated, or give a real value"
                )
        self.coordinator_config()  # raises ValueError on inconsistent timings
        self.metrics_address()  # raises ValueError on a bad or non-loopback address
        self.principal_entries()  # raises ValueError on a malformed principals document
        return self

    def principal_entries(self) -> dict[str, PrincipalEntry]:
        out: dict[str, PrincipalEntry] = {}
        if self.principals:
            out.update(parse_principals(self.principals))
        if self.principals_file:
            try:
                text = Path(self.principals_file).read_text(encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"cannot read the principals file: {exc.strerror}") from None
            for name, entry in parse_principals(text).items():
                if name in out:
                    raise ValueError(f"principal {name!r} is listed twice")
                out[name] = entry
        if self.admin_username in out:
            raise ValueError(f"principal {self.admin_username!r} is also the bootstrap admin")
        return out

    def metrics_address(self) -> tuple[str, int] | None:
        """``METRICS_LISTEN`` as (host, port); None when unset."""
        if self.metrics_listen is None:
            return None
        host, sep, port_text = self.metrics_listen.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        port = ascii_uint(port_text, 65_535)
        if not sep or not host or port is None:
            raise ValueError("STREAMKIT_SERVER_METRICS_LISTEN must be host:port")
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            # Unauthenticated there: a reachable address would publish every
            # stream and group name to anyone on the network.
            raise ValueError(
                "STREAMKIT_SERVER_METRICS_LISTEN must be a loopback address (it serves "
                "/metrics without credentials); scrape the main port with READ instead"
            )
        return host, port

    def coordinator_config(self) -> CoordinatorConfig:
        return CoordinatorConfig(
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            member_lease_ttl_ms=self.member_lease_ttl_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            producer_routing_lease_ms=self.producer_routing_lease_ms,
            max_members_per_group=self.max_members_per_group,
        )
