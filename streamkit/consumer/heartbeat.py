"""``HeartbeatSender``: one member's requests to the coordinator, timed and bounded.

The member runtime decides when to heartbeat and what the answer means (with
the state machine); this sends one request and says how long to wait:

* a heartbeat may take as long as the lease has left, but at least an
  interval, so a hung coordinator never keeps the member from trying again;
* after failures it backs off (jittered, exponential), but never waits longer
  than an interval while the lease is still valid, so the lease survives a
  short outage;
* a leave (epoch -1) is tried a few times, then left to the member lease.

Every answered heartbeat is counted with its round-trip time (metrics), and
with ``STREAMKIT_TRACE_DEBUG`` gets a ``CLIENT`` span.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import KW_ONLY, dataclass, field

import anyio
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from streamkit.backoff import jittered_backoff
from streamkit.consumer.lifecycle import monotonic_ms
from streamkit.consumer.member import MemberStateMachine
from streamkit.consumer.stats import Timing, end_span
from streamkit.coordinator_client import CoordinatorClient, CoordinatorError, CoordinatorUnavailable
from streamkit.protocol import HeartbeatRequest, HeartbeatResponse, HeartbeatStatus

__all__ = ["HeartbeatSender"]

log = logging.getLogger("streamkit.consumer")

_RETRY_BASE_MS = 100
_RETRY_CAP_MS = 5_000
_LEAVE_ATTEMPTS = 3


@dataclass(eq=False, repr=False)
class HeartbeatSender:
    """Sends one member's heartbeats (and its leave) for ``stream_prefix``/``consumer_group``."""

    machine: MemberStateMachine
    client: CoordinatorClient
    _: KW_ONLY
    stream_prefix: str
    consumer_group: str
    request_timeout_s: float
    debug_tracer: trace.Tracer | None
    #: Answered heartbeats with their round-trip time, and failed ones (metrics).
    timing: Timing = field(default_factory=Timing, init=False)

    async def send(self, request: HeartbeatRequest) -> HeartbeatResponse:
        """One heartbeat, within ``request_timeout_ms()``."""
        span = None
        if self.debug_tracer is not None:
            span = self.debug_tracer.start_span("streamkit heartbeat", kind=SpanKind.CLIENT)
            if span.is_recording():
                span.set_attribute("streamkit.member_id", self.machine.member_id)
                span.set_attribute("streamkit.epoch", request.member_epoch)
        started = time.perf_counter()
        try:
            with anyio.fail_after(self.request_timeout_ms() / 1000):
                response = await self.client.heartbeat(
                    self.stream_prefix, self.consumer_group, request
                )
        except Exception as exc:  # not cancellation: a stop is no failed heartbeat
            self.timing.failures += 1
            end_span(span, exc)
            raise
        except BaseException:
            end_span(span, None)
            raise
        self.timing.add(time.perf_counter() - started)
        end_span(span, None)
        return response

    async def leave(self, *, for_restart: bool) -> None:
        """Leave the group (epoch -1); after a few failures the member lease does it."""
        machine = self.machine
        for attempt in range(1, _LEAVE_ATTEMPTS + 1):
            request = machine.leave_request(monotonic_ms(), for_restart=for_restart)
            try:
                response = await self.send(request)
            except (CoordinatorUnavailable, CoordinatorError, TimeoutError) as exc:
                machine.request_failed()
                if attempt == _LEAVE_ATTEMPTS:
                    log.warning(
                        "%s: could not leave (%s); the coordinator will expire the member "
                        "after its lease",
                        machine.member_id,
                        str(exc) or type(exc).__name__,  # the message, not a repr of it
                    )
                    return
                await anyio.sleep(self.retry_delay_ms(attempt) / 1000)
                continue
            if response.status is HeartbeatStatus.INVALID_REQUEST and machine.static:
                # A coordinator without static leaves (the reference server):
                # leave the plain way, the shards move at once.
                machine.static = False
                continue
            machine.on_response(response)
            log.info("%s: left the group", machine.member_id)
            return

    def request_timeout_ms(self) -> int:
        """A heartbeat may take as long as the lease has left, but at least an
        interval: a hung coordinator must not keep us from trying again."""
        interval = self.machine.heartbeat_interval_ms
        remaining = self.machine.lease_remaining_ms(monotonic_ms())
        return int(min(self.request_timeout_s * 1000, max(interval, remaining)))

    def retry_delay_ms(self, failures: int) -> int:
        interval = self.machine.heartbeat_interval_ms
        cap = max(interval, min(_RETRY_CAP_MS, 10 * interval))
        if self.machine.lease_valid(monotonic_ms()):
            # Keep the lease alive: at least one attempt per interval.
            cap = min(cap, interval)
        return int(jittered_backoff(failures, _RETRY_BASE_MS, cap, random.random()))

    def log_failure(self, exc: BaseException, failures: int) -> None:
        if failures == 1 or failures % 10 == 0:
            machine = self.machine
            if not machine.joined:
                lease = "not joined yet"
            elif machine.lease_valid(monotonic_ms()):
                lease = "lease valid"
            else:
                lease = "lease expired"
            log.warning(
                "%s: heartbeat failed (%d in a row, %s): %s",
                machine.member_id,
                failures,
                lease,
                exc or repr(exc),
            )
