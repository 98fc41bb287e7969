"""Client settings, read from ``STREAMKIT_*`` environment variables or ``.env``."""

from __future__ import annotations

import os
import socket

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_member_id_base() -> str:
    """``POD_IP`` when running in Kubernetes, else the host name."""
    return os.environ.get("POD_IP") or socket.gethostname()


class StreamKitSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="STREAMKIT_", env_file=".env", extra="ignore", frozen=True
    )

    coordinator_url: str = "http://127.0.0.1:8080"
    coordinator_username: str | None = None
    coordinator_password: SecretStr | None = None
    coordinator_token: SecretStr | None = None
    #: Seconds one coordinator HTTP call may take before it counts as failed.
    coordinator_timeout: float = 5.0
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_cluster: bool = False
    member_id_base: str = Field(default_factory=default_member_id_base)
    #: Local assignment lease in ms; must not exceed the coordinator's member
    #: lease TTL. Unset: two heartbeat intervals (always within the TTL).
    assignment_lease_ms: int | None = None
    #: Producer routing cache: refresh interval and lease, in seconds.
    routing_refresh_interval: float = 5.0
    routing_lease: float = 30.0
    #: Default failure policy of stream listeners (``FailurePolicy``): deliveries
    #: before a failing entry is dead-lettered, and the retry backoff in ms.
    retry_max_attempts: int = Field(default=5, ge=1)
    retry_backoff_ms: int = Field(default=200, ge=0)
    retry_backoff_max_ms: int = Field(default=30_000, ge=0)
    #: ``MAXLEN ~`` of dead-letter streams.
    dead_letter_maxlen: int = Field(default=100_000, ge=1)

    @model_validator(mode="after")
    def _check(self) -> StreamKitSettings:
        if bool(self.coordinator_username) != bool(self.coordinator_password):
            raise ValueError(
                "set both STREAMKIT_COORDINATOR_USERNAME and STREAMKIT_COORDINATOR_PASSWORD, "
                "or neither"
            )
        if self.routing_lease <= self.routing_refresh_interval:
            raise ValueError(
                "STREAMKIT_ROUTING_LEASE must exceed STREAMKIT_ROUTING_REFRESH_INTERVAL"
            )
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ValueError(
                "STREAMKIT_RETRY_BACKOFF_MAX_MS must be at least STREAMKIT_RETRY_BACKOFF_MS"
            )
        return self
