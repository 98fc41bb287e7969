"""Server settings: environment variables ``STREAMKIT_SERVER_*``, each also a CLI flag.

Each field's ``description`` is the one text about it: ``streamkit-server
--help`` shows it, and it is the Meaning column of the settings table in
``docs/operations.md`` (``tests/test_docs.py`` keeps the two equal).

Secrets without a configured value are generated at start-up (see ``cli``),
never defaulted to a well-known string; an empty or blank one is refused,
because it would look configured while protecting nothing.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streamkit.numerals import ascii_uint
from streamkit_server.auth.principals import PrincipalEntry, parse_principals
from streamkit_server.core import MAX_SHARD_COUNT, CoordinatorConfig
from streamkit_server.core.retention import (
    MAX_RETENTION_AGE_MS,
    MAX_RETENTION_LENGTH,
    RetentionPolicy,
)
from streamkit_server.store.keys import DEFAULT_KEY_PREFIX

__all__ = ["ServerSettings"]

#: The core's own defaults: a tunable the settings expose defaults to the same value.
_CORE = CoordinatorConfig()


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STREAMKIT_SERVER_", extra="ignore")

    host: str = Field(
        "127.0.0.1",
        description="Interface the HTTP listener binds to. Use `0.0.0.0` in a container.",
    )
    port: int = Field(
        default=8080,
        ge=0,
        le=65535,
        description="TCP port of the HTTP listener (0 to 65535).",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description=(
            "The Redis that holds the metadata and the shard streams, in redis-py URL "
            "syntax (`rediss://` for TLS, credentials in the URL). With cluster mode on, "
            "any node serves as the start-up node."
        ),
    )
    redis_cluster: bool = Field(
        False,
        description=(
            "Talk to a Redis Cluster (redis-py `RedisCluster`) instead of a single server."
        ),
    )
    admin_username: str = Field(
        default="admin",
        min_length=1,
        description=(
            "Name of the built-in principal. It holds the roles `READ`, `WRITE` and `MEMBER`."
        ),
    )
    admin_password: SecretStr | None = Field(
        None,
        description="Its password. Unset: a random one is generated and printed once at start-up.",
    )
    # None: a random secret created once in Redis (SET NX) and shared by every
    # coordinator process on that Redis, so their tokens are interchangeable.
    token_secret: SecretStr | None = Field(
        None,
        description=(
            "Key that signs bearer tokens (HMAC-SHA256). Unset: a random key created once"
            " in Redis (`<KEY_PREFIX>:auth:token-secret`, `SET NX`) and used by every "
            "process on that Redis, so tokens survive restarts and work on every process."
            " Changing it invalidates every issued token."
        ),
    )
    # Accepted (never used to sign) so a secret rotation needs no downtime:
    # set the new TOKEN_SECRET with the old one here, drop it after one TTL.
    token_secret_previous: SecretStr | None = Field(
        None,
        description=(
            "The signing key being rotated out: still accepted, never used to sign (see "
            "[Authentication](#authentication))."
        ),
    )
    token_ttl_seconds: int = Field(
        default=3600,
        ge=1,
        description=(
            "Lifetime of a bearer token in seconds (one hour; clients log in again on a 401)."
        ),
    )
    principals: str | None = Field(
        None,
        description=(
            "Principals besides the admin, as JSON (`username`, `passwordHash`, `roles`, "
            "optional `streams`/`groups` patterns; see [Authentication](#authentication))."
        ),
    )
    principals_file: str | None = Field(
        None,
        description="A file with the same JSON.",
    )
    key_prefix: str = Field(
        default=DEFAULT_KEY_PREFIX,
        min_length=1,
        description=(
            "Prefix of every coordinator key in Redis (see [key layout](#redis-key-layout))."
        ),
    )
    heartbeat_interval_ms: int = Field(
        default=_CORE.heartbeat_interval_ms,
        ge=1,
        description="Heartbeat interval announced to members in every answer.",
    )
    member_lease_ttl_ms: int = Field(
        default=_CORE.member_lease_ttl_ms,
        ge=1,
        description=(
            "A member silent for longer than this is expired and its shards are "
            "reassigned. Must be at least twice the heartbeat interval."
        ),
    )
    rebalance_timeout_ms: int = Field(
        default=_CORE.rebalance_timeout_ms,
        ge=1,
        description=(
            "Time a member has to give up a shard it was asked to revoke before it is "
            "fenced. Must be at least twice the heartbeat interval: a member hears of a "
            "revocation only at its next heartbeat, so a shorter timeout fences members "
            "that did nothing wrong, over and over."
        ),
    )
    tick_interval_ms: int = Field(
        default=1_000,
        ge=1,
        description=(
            "Period of the tick loop, which applies lease expiry, rebalance-timeout "
            "fencing, clean-up of departed members and time-driven migration steps."
        ),
    )
    retention_interval_ms: int = Field(
        default=10_000,
        ge=1,
        description=(
            "Period of the retention janitor, which trims each shard stream of a stream "
            "with retention up to the oldest entry some consumer group still needs (see "
            "[Retention](#retention))."
        ),
    )
    retention_max_age_ms: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RETENTION_AGE_MS,
        description=(
            "Default retention by age (ms) for streams without a retention of their own; "
            "never past what a group still needs."
        ),
    )
    retention_max_length: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RETENTION_LENGTH,
        description=(
            "Default retention by length (entries per shard) for streams without a "
            "retention of their own; never past what a group still needs."
        ),
    )
    # The longest routing lease any producer uses (STREAMKIT_ROUTING_LEASE on
    # the clients, in seconds there): a removed shard is proven drained only
    # after this much time has passed since the layout switched.
    producer_routing_lease_ms: int = Field(
        default=_CORE.producer_routing_lease_ms,
        ge=0,
        description=(
            "The longest routing-cache lease any producer uses. After a layout change, a "
            "removed shard is only probed for the drain proof once this much time has "
            "passed. Keep it at or above every producer's `STREAMKIT_ROUTING_LEASE` "
            "(which is in seconds)."
        ),
    )
    default_shard_count: int = Field(
        default=4,
        ge=1,
        le=MAX_SHARD_COUNT,
        description=(
            "Shard count used when a create request has no `initialShardCount` (1 to 4096)."
        ),
    )
    max_members_per_group: int = Field(
        default=_CORE.max_members_per_group,
        ge=1,
        le=65_536,
        description=(
            "Live members one group may have (1 to 65536). A join beyond it is answered "
            "`400 TOO_MANY_MEMBERS`. Records of departed members are kept at most four times "
            "this many: past that a join drops the oldest that hold nothing, so restarts never "
            "lock live processes out."
        ),
    )
    # The member API (heartbeats) needs a MEMBER principal unless this unsafe
    # switch is on; meant for local development only (a warning is logged).
    insecure_member_api: bool = Field(
        False,
        description=(
            "Unsafe, for local development only: open the heartbeat endpoint to callers "
            "without credentials. Logs a warning at start. Off: heartbeats need the "
            "`MEMBER` role."
        ),
    )
    # Group mutex: how long a holder may keep it (crash safety) and how long a
    # request waits for it before answering RETRY.
    mutex_ttl_ms: int = Field(
        default=5_000,
        ge=100,
        description=(
            "Expiry of a group mutex (at least 100). A crashed holder blocks its group "
            "for at most this long; shutdown also waits at most this long for critical "
            "sections in progress."
        ),
    )
    mutex_wait_ms: int = Field(
        default=2_000,
        ge=1,
        description=(
            "How long a request waits for a taken group mutex. Then a heartbeat is "
            "answered `RETRY` and an admin mutation `503 COORDINATOR_BUSY`."
        ),
    )
    max_header_bytes: int = Field(
        default=16 * 1024,
        ge=1024,
        description=(
            "A request line and headers above this size are refused with `431` and the "
            "connection closed, before they are parsed further."
        ),
    )
    header_timeout_ms: int = Field(
        default=10_000,
        ge=100,
        description=(
            "A connection that has not sent complete request headers this long after it "
            "opened (or after the first byte of its next request) is closed."
        ),
    )
    body_timeout_ms: int = Field(
        default=30_000,
        ge=100,
        description=(
            "A request body not complete this long after the server began reading it is "
            "refused with `408 REQUEST_TIMEOUT`."
        ),
    )
    max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description=(
            "Request bodies above this size (at least 1024) are refused with `413 "
            "PAYLOAD_TOO_LARGE` before they are parsed."
        ),
    )
    # After SIGTERM: how long the process keeps answering 503
    # COORDINATOR_TERMINATING (so clients on open connections move to another
    # coordinator) before it closes its listener and exits.
    shutdown_grace_ms: int = Field(
        default=1_000,
        ge=0,
        description=(
            "After SIGTERM, how long the process keeps answering `503 "
            "COORDINATOR_TERMINATING` before it closes its listener."
        ),
    )
    # Rate limits (0 turns one off), shared by every process through Redis.
    # Failed logins (login endpoint and Basic credentials) per minute, per
    # username tried and per client address: brute force, never a healthy fleet.
    login_failures_per_minute: int = Field(
        default=10,
        ge=0,
        description=(
            "Failed logins (login endpoint or Basic credentials) per username tried and client "
            "address, per minute, before that pair gets `429` (0: off). See "
            "[rate limits](#rate-limits)."
        ),
    )
    login_failures_backstop_per_minute: int = Field(
        default=100,
        ge=0,
        description=(
            "Failed logins of all names and addresses together per minute; above it, only "
            "pairs without a failure in the window are still checked (0: off)."
        ),
    )
    # Admin mutations (WRITE routes) per principal per minute.
    admin_mutations_per_minute: int = Field(
        default=600,
        ge=0,
        description="Requests to `WRITE` operations per principal per minute (0: off).",
    )
    # Joins (memberEpoch 0) per member principal per minute: a rolling
    # restart of a large fleet under one credential stays far below it.
    joins_per_minute: int = Field(
        default=1_200,
        ge=0,
        description=(
            "Joins (`memberEpoch` 0) one principal may send per minute, all groups together, "
            "before it gets `429` (0: off). A loop of joins under fresh member ids would "
            "otherwise churn a group's records and rebalance it without end."
        ),
    )
    # Heartbeats per group per heartbeat interval, as a multiple of the most
    # members a group may have: each member sends one per interval.
    heartbeat_rate_multiple: int = Field(
        default=10,
        ge=0,
        description=(
            "Heartbeats one group may send per heartbeat interval, as a multiple of "
            "`MAX_MEMBERS_PER_GROUP` (0: off)."
        ),
    )
    # Also copy every audit record to this Redis stream (a key name; None:
    # log only), trimmed to about AUDIT_STREAM_MAXLEN entries.  Written off
    # the request path: a Redis error never fails a request.
    audit_stream: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Also copy every audit record to this Redis stream key, off the request path "
            "(see [Audit log](#audit-log))."
        ),
    )
    audit_stream_maxlen: int = Field(
        default=100_000,
        ge=1,
        description="About how many records the audit stream keeps (`XADD MAXLEN ~`).",
    )
    # "host:port" of a second listener serving only /metrics, without
    # credentials; loopback addresses only (a sidecar or node agent scrapes it).
    metrics_listen: str | None = Field(
        None,
        description=(
            "`host:port` of a second listener serving only `/metrics`, without "
            "credentials; loopback addresses only (see [Metrics](#metrics))."
        ),
    )
    # Per-shard and per-member families on /metrics keep at most this many
    # series each (detail_gauges.py): the most severe ones.
    metrics_series_cap: int = Field(
        default=2_000,
        ge=0,
        description=(
            "Series each per-shard or per-member metric family keeps at most (0: none); "
            "see [Metrics](#metrics)."
        ),
    )
    lag_sample_interval_ms: int = Field(
        default=15_000,
        ge=0,
        description=(
            "How often every group's shard lag and pending counts are read from Redis "
            "(`XINFO GROUPS`, pipelined) for the per-shard gauges and the throughput of "
            "[autoscaling](#autoscaling) (0: only when the autoscaling endpoint is called)."
        ),
    )
    log_level: str = Field(
        "info",
        description="Log level of the coordinator and of uvicorn.",
    )
    api_explorer: bool = Field(
        False,
        description=(
            "Serve the interactive API explorer (Swagger UI) at `/docs`; it loads its "
            "scripts from cdn.jsdelivr.net. `/openapi.json` is always served."
        ),
    )
    access_log: bool = Field(
        False,
        description="Write uvicorn's access log line for every request.",
    )

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
        if any(c in self.key_prefix for c in "/{}%") or not self.key_prefix.isprintable() \
                or any(c.isspace() for c in self.key_prefix):  # fmt: skip
            # '/' marks dead-letter keys (``{prefix}/dlq/{group}``) and braces
            # change hash tags: either would let other keys enter the prefix.
            raise ValueError(
                "STREAMKIT_SERVER_KEY_PREFIX must not contain '/', braces, '%', whitespace "
                "or control characters"
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
        # Every core tunable these settings expose, under the same name: a new
        # setting reaches the core without a line here.
        exposed = {f.name for f in dataclasses.fields(CoordinatorConfig)} & set(
            type(self).model_fields
        )
        return CoordinatorConfig(**{name: getattr(self, name) for name in exposed})

    def default_retention(self) -> RetentionPolicy | None:
        """The retention of streams without their own (None: none)."""
        if self.retention_max_age_ms is None and self.retention_max_length is None:
            return None
        return RetentionPolicy(self.retention_max_age_ms, self.retention_max_length)
