"""Client settings, read from ``STREAMKIT_*`` environment variables or ``.env``.

An invalid value raises ``SettingsError``: one line that names the variable
and what it must be, never pydantic's multi-line report (the CLI prints it as
its ``error:`` line, and a script's traceback ends with it).
"""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streamkit.errors import StreamkitError

__all__ = ["SettingsError", "StreamKitSettings", "default_member_id_base", "set_where"]

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
_HTTP_SCHEMES = ("http://", "https://")
#: Settings whose value an error message must never repeat.
_SECRETS = frozenset({"coordinator_password", "coordinator_token", "redis_url"})


class SettingsError(StreamkitError, ValueError):
    """A ``STREAMKIT_*`` setting (or a keyword given for one) is invalid."""


def set_where(name: str) -> str:
    """Where setting ``name`` comes from, for an error line: ``"./.env"`` when
    the environment lacks it and ``./.env`` sets it (a file ``streamkit dev``
    writes, and may have left behind), else ``""``."""
    if name in os.environ:
        return ""
    try:
        with open(".env", encoding="utf-8") as env_file:
            lines = env_file.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    for line in lines:
        words = line.strip().removeprefix("export ").lstrip()
        if words.partition("=")[0].strip().upper() == name.upper():
            return "./.env"
    return ""


def default_member_id_base() -> str:
    """``POD_IP`` when running in Kubernetes, else the host name."""
    return os.environ.get("POD_IP") or socket.gethostname()


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def _env_name(field: str) -> str:
    return f"STREAMKIT_{field.upper()}"


def _one_line(exc: ValidationError) -> str:
    """pydantic's first complaint as one sentence naming the variable."""
    first = exc.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    field = ".".join(str(part) for part in first["loc"])
    if not field or message.startswith("STREAMKIT_"):  # the message names the variables
        return message
    shown = "" if field in _SECRETS else f"={first.get('input')!r}"
    hint = " (true or false)" if first["type"] == "bool_parsing" else ""
    return f"{_env_name(field)}{shown}: {message[0].lower()}{message[1:]}{hint}"


def _without_credentials(url: str) -> str:
    _, at, tail = url.rpartition("@")
    return f"***@{tail}" if at else url


class StreamKitSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="STREAMKIT_", env_file=".env", extra="ignore", frozen=True
    )

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError(_one_line(exc)) from None

    coordinator_url: str = "http://127.0.0.1:8080"
    coordinator_username: str | None = None
    coordinator_password: SecretStr | None = None
    coordinator_token: SecretStr | None = None
    #: Seconds one coordinator HTTP call may take before it counts as failed.
    coordinator_timeout: float = 5.0
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_cluster: bool = False
    #: Seconds a member may go without a successful Redis read or ack, once one
    #: failed, before it gives its shards back and leaves the group until Redis
    #: answers again (so members that can read take them over).
    redis_release_after: float = Field(default=15.0, gt=0)
    #: The readable start of this process's member ids.  Each start of the
    #: process adds a random part, so processes with identical settings are
    #: distinct members (``{base}-{random}-m{i}``), unless ``static_membership``.
    member_id_base: str = Field(default_factory=default_member_id_base)
    #: Static membership: member ids are exactly ``{base}-m{i}`` on every start
    #: (give each process its own base).  A second process with the same ids is
    #: refused while the first lives; a graceful stop keeps the shards reserved
    #: for the restart until the member lease runs out.
    static_membership: bool = False
    #: Local assignment lease in ms; must not exceed the coordinator's member
    #: lease TTL (checked against the coordinator's answer: a member refuses
    #: to start otherwise). Unset: two heartbeat intervals (always within it).
    assignment_lease_ms: int | None = Field(default=None, ge=1)
    #: Data-plane Redis: seconds to connect, and seconds any command may take
    #: (must exceed every listener's block_ms).
    redis_connect_timeout: float = Field(default=5.0, gt=0)
    redis_socket_timeout: float = Field(default=10.0, gt=0)
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
    #: Field in which publishers write the W3C ``traceparent`` of their span
    #: (only while a tracer provider records spans); "" turns it off.
    trace_context_field: str = "traceparent"
    #: Debug spans: one per heartbeat and one per Redis read of every member
    #: (needs a tracer provider; many spans, so off by default).
    trace_debug: bool = False
    #: ``HOST:PORT`` of the probe/metrics HTTP server of ``streamkit run``; None: off.
    http: str | None = None
    #: ``streamkit run``: once the app started, collect garbage once and freeze
    #: what is alive (``gc.freeze()``), so that later full collections do not
    #: rescan the imported modules and the app's long-lived objects (tens of
    #: milliseconds per collection in a handler's latency otherwise).
    gc_freeze: bool = True

    def member_id_prefix(self, incarnation: str) -> str:
        """What member ids of one start of this process begin with."""
        if self.static_membership:
            return self.member_id_base
        # A random part per start keeps ids apart between starts and between
        # processes on one host.  It is derived one way from the incarnation:
        # member ids are shown to anyone with READ, and the incarnation is
        # what lets a member leave, so no digit of it may show.
        digest = hashlib.sha256(b"member-id:" + incarnation.encode()).hexdigest()
        return f"{self.member_id_base}-{digest[:8]}"

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if not value.startswith(_REDIS_SCHEMES):
            # redis-py would say only "must specify one of the following schemes".
            raise ValueError(
                f"STREAMKIT_REDIS_URL={_without_credentials(value)!r} is not a Redis URL; "
                "write it as redis://HOST:PORT/DB (rediss:// for TLS, unix:///path for a "
                "socket), e.g. redis://127.0.0.1:6379/0"
            )
        return value

    @field_validator("coordinator_url")
    @classmethod
    def _coordinator_url(cls, value: str) -> str:
        if not value.startswith(_HTTP_SCHEMES) or len(value.split("://", 1)[1]) == 0:
            raise ValueError(
                f"STREAMKIT_COORDINATOR_URL={value!r} is not an HTTP URL; write it as "
                "http://HOST:PORT (https:// for TLS), e.g. http://127.0.0.1:8080"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> StreamKitSettings:
        for name, value in (
            ("COORDINATOR_USERNAME", self.coordinator_username),
            ("COORDINATOR_PASSWORD", _secret(self.coordinator_password)),
            ("COORDINATOR_TOKEN", _secret(self.coordinator_token)),
        ):
            # A blank value looks configured but authenticates nobody.
            if value is not None and not value.strip():
                raise ValueError(f"STREAMKIT_{name} is empty or blank; unset it or give a value")
        if bool(self.coordinator_username) != bool(self.coordinator_password):
            pair = ("USERNAME", "PASSWORD")
            given, missing = pair if self.coordinator_username else pair[::-1]
            raise ValueError(
                f"STREAMKIT_COORDINATOR_{given} is set but STREAMKIT_COORDINATOR_{missing} is "
                "not: set both STREAMKIT_COORDINATOR_USERNAME and STREAMKIT_COORDINATOR_PASSWORD, "
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
