"""Per-process runtime: Redis client, store, service, tick loop, health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any, Generic, TypeVar

from redis.exceptions import RedisError

from streamkit.connections import connect_redis
from streamkit.protocol import HealthResponse
from streamkit_server.auth.ratelimit import RateLimiter
from streamkit_server.auth.security import Authenticator
from streamkit_server.auth.token_secret import shared_token_secret
from streamkit_server.auth.token_versions import TokenVersions
from streamkit_server.coordination.dead_letters import DeadLetters
from streamkit_server.coordination.dlq_migration import migrate_dead_letters
from streamkit_server.coordination.drain import DrainProber
from streamkit_server.coordination.gate import TerminatingGate
from streamkit_server.coordination.loop import TickLoop
from streamkit_server.coordination.resharding import ReshardingService
from streamkit_server.coordination.retention import RetentionJanitor, Trimmer
from streamkit_server.coordination.service import CoordinatorService
from streamkit_server.coordination.timings import Timings
from streamkit_server.core import LAYOUT_VERSION, SCHEMA_VERSION
from streamkit_server.observability.audit import emit as emit_audit
from streamkit_server.observability.audit_stream import AuditStream
from streamkit_server.observability.health import HealthFacts, assess
from streamkit_server.observability.metrics import Metrics
from streamkit_server.observability.metrics_listener import MetricsListener
from streamkit_server.settings import ServerSettings
from streamkit_server.store.metadata import MetadataStore
from streamkit_server.store.provisioning import Provisioner
from streamkit_server.store.records import RedisClient

__all__ = ["Runtime", "make_redis_client"]

log = logging.getLogger("streamkit_server")


def make_redis_client(settings: ServerSettings) -> RedisClient:
    """One client (and connection pool) per process, with the data plane's fast
    command packer (``streamkit.connections``)."""
    return connect_redis(
        settings.redis_url,
        cluster=settings.redis_cluster,
        connect_timeout=2.0,
        socket_timeout=5.0,
        decode_responses=False,
    )


_T = TypeVar("_T")


class _Started(Generic[_T]):
    """A part ``Runtime.start`` creates, kept in ``_<name>``: reading it before the
    start (or after a failed one) is an error, not a None to trip over later."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    def __get__(self, runtime: Runtime, owner: type | None = None) -> _T:
        value: _T | None = getattr(runtime, self._slot)
        if value is None:
            raise RuntimeError("the coordinator runtime has not been started")
        return value


class Runtime:
    client: _Started[RedisClient] = _Started()
    token_versions: _Started[TokenVersions] = _Started()
    service: _Started[CoordinatorService] = _Started()
    resharding: _Started[ReshardingService] = _Started()
    dead_letters: _Started[DeadLetters] = _Started()

    def __init__(
        self, settings: ServerSettings, admin_password: str, token_secret: bytes | None
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.gate = TerminatingGate()
        previous = settings.token_secret_previous
        self.authenticator = Authenticator(
            settings.admin_username,
            admin_password,
            token_secret,
            settings.token_ttl_seconds,
            principals=settings.principal_entries(),
            previous_secrets=[previous.get_secret_value().encode()] if previous else [],
        )
        self.coordinator_id = f"coord-{secrets.token_hex(6)}"
        #: Wall clock (seconds) when the process' figures started counting.
        self.started_at = time.time()
        self._client: RedisClient | None = None
        self._service: CoordinatorService | None = None
        self._resharding: ReshardingService | None = None
        self._dead_letters: DeadLetters | None = None
        self.tick_loop: TickLoop | None = None
        self.limiter: RateLimiter | None = None
        self._tick_task: asyncio.Task[None] | None = None
        self.retention: RetentionJanitor | None = None
        self._retention_task: asyncio.Task[None] | None = None
        self.audit_stream: AuditStream | None = None
        self.timings: Timings | None = None
        self.metrics_listener: MetricsListener | None = None
        self._token_versions: TokenVersions | None = None
        self._watch_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._client = make_redis_client(self.settings)
        if self.authenticator.secret is None:
            self.authenticator.secret = await shared_token_secret(
                self._client, self.settings.key_prefix
            )
        self._token_versions = TokenVersions(
            self._client, self.settings.key_prefix, self.metrics.token_version_reads
        )
        self._watch_task = asyncio.create_task(
            self._token_versions.watch(), name="streamkit-token-versions"
        )
        store = MetadataStore(self._client, self.settings.key_prefix, self.metrics)
        self._service = CoordinatorService(
            store, Provisioner(self._client), self.settings, self.metrics, self.gate
        )
        self._resharding = ReshardingService(self._service, DrainProber(self._client))
        self._dead_letters = DeadLetters(self._service, self._client)
        self.limiter = RateLimiter(self._client, self.settings.key_prefix)
        try:
            await store.rebuild_index()
        except RedisError as exc:  # the tick loop retries it
            log.warning("could not rebuild the group index at start-up: %s", exc)
        try:
            await migrate_dead_letters(self._client, store)
        except RedisError as exc:  # the next start finishes it
            log.warning("could not move old dead-letter streams at start-up: %s", exc)
        self.timings = Timings(
            self._client,
            self.settings.key_prefix,
            self.coordinator_id,
            self.settings.coordinator_config(),
        )
        # `streamkit-server` has registered already (a one-line refusal); an
        # app built in-process learns of a conflict here.
        await self.timings.register_at_start()  # a TimingConflict fails the start
        self.tick_loop = TickLoop(
            self._service, self.settings.tick_interval_ms, self._resharding, self.timings
        )
        self._tick_task = asyncio.create_task(self.tick_loop.run(), name="streamkit-tick")
        self.retention = RetentionJanitor(
            self._service, Trimmer(self._client), self.settings.retention_interval_ms
        )
        self._retention_task = asyncio.create_task(self.retention.run(), name="streamkit-retention")
        if self.settings.audit_stream is not None:
            self.audit_stream = AuditStream(
                self._client,
                self.settings.audit_stream,
                self.settings.audit_stream_maxlen,
                self.metrics.audit_stream_failures,
                self.coordinator_id,
            )
            self.audit_stream.start()
        self._service.audit = self._audit
        address = self.settings.metrics_address()
        if address is not None:
            self.metrics_listener = MetricsListener(self.metrics.registry, *address)
            await self.metrics_listener.start()
            log.info("serving /metrics without credentials on %s", self.settings.metrics_listen)

    def _audit(self, record: dict[str, Any]) -> None:
        """An audit record the service made (not tied to a refused request)."""
        emit_audit(record, self.audit_stream)

    def begin_terminating(self) -> None:
        """Close the gate: new heartbeats/mutations get 503; the tick stops scheduling."""
        if not self.gate.terminating:
            log.info("terminating: refusing new heartbeats and admin mutations")
        self.gate.close()
        self.metrics.terminating.set(1)

    async def stop(self) -> None:
        self.begin_terminating()
        # In-flight critical sections finish their write and release the mutex.
        await self.gate.wait_idle(self.settings.mutex_ttl_ms / 1000)
        for task in (self._tick_task, self._retention_task, self._watch_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.metrics_listener is not None:
            await self.metrics_listener.stop()
        if self.audit_stream is not None:
            await self.audit_stream.stop()
        if self.timings is not None:
            # Marked stopped: other timings may start once its leases have run out.
            with contextlib.suppress(RedisError, OSError):
                await self.timings.mark_stopped()
        if self._client is not None:
            await self._client.aclose()

    async def health(self) -> HealthResponse:
        rtt: float | None = None
        error: str | None = None
        try:
            started = time.perf_counter()
            await asyncio.wait_for(self.client.ping(), timeout=1.0)
            rtt = time.perf_counter() - started
        except (RedisError, OSError, TimeoutError) as exc:
            # redis-py messages name host and port, never the URL's password.
            error = f"{type(exc).__name__}: {exc}"
        tick = self.tick_loop
        interval_s = self.settings.tick_interval_ms / 1000
        facts = HealthFacts(
            redis_rtt_s=rtt,
            redis_error=error,
            terminating=self.gate.terminating,
            loop_running=tick is not None and tick.running,
            tick_lag_s=tick.lag_seconds() if tick is not None else None,
            tick_interval_s=interval_s,
            tick_error=tick.last_error if tick is not None else None,
            unreadable_groups=tick.unreadable if tick is not None else (),
            suspended=self.gate.suspended,
        )
        verdict = assess(facts)
        return HealthResponse(
            status=verdict.status,
            coordinator_id=self.coordinator_id,
            redis=verdict.redis,
            loop=verdict.loop,
            reasons=list(verdict.reasons),
            terminating=facts.terminating,
            tick_lag_seconds=None if facts.tick_lag_s is None else round(facts.tick_lag_s, 3),
            tick_interval_seconds=interval_s,
            schema_version=SCHEMA_VERSION,
            layout_version=LAYOUT_VERSION,
            unreadable_groups=list(facts.unreadable_groups),
        )
