"""``streamkit demo``: the whole system on one machine, in about a minute.

It starts a private ``redis-server`` (unless ``--redis-url`` names one), a
coordinator, the ``orders`` stream with 8 shards, two consumer processes
running ``samples.orders.app`` (concurrency 2 each) and a publisher; shows the
shards, owners and lag live; scales to 12 shards partway and kills one
consumer process, so rebalancing, pending-entry claiming and resharding
happen in front of you; then drains, prints a summary and cleans up.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
from redis.exceptions import RedisError
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from streamkit.connections import AsyncRedis, connect_redis
from streamkit.coordinator_client import CoordinatorClient
from streamkit.demo.dev import client_env
from streamkit.demo.services import LocalServices
from streamkit.errors import StreamkitError
from streamkit.protocol import API_PREFIX
from streamkit.publisher.publisher import Publisher, PublishError
from streamkit.publisher.routing_cache import RoutingUnavailable
from streamkit.routing import stream_key
from streamkit.scripts import slot_key
from streamkit.settings import StreamKitSettings
from streamkit.status import GroupStatus, fetch_status, headline, render
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit.testing.redis_server import RedisServer

API = API_PREFIX
ORDERS, BILLING = "orders", "billing"
INVOICES, ACCOUNTING = "invoices", "accounting"
BILLED, DELIVERIES = "samples:orders:billed", "samples:orders:deliveries"
SAMPLE_APP = "samples.orders.app:app"
# Short timings so a newcomer sees a rebalance within seconds; production
# defaults are 3 s heartbeats and a 15 s member lease.
HEARTBEAT_MS, LEASE_MS, ROUTING_LEASE_S = 500, 3_000, 2.0


@dataclass
class DemoOptions:
    services: LocalServices = field(default_factory=LocalServices)
    duration: float = 60.0
    shards: int = 8
    scale_to: int = 12
    rate: float = 400.0
    # Wait for Enter before the timeline and after the summary, so there is
    # time to open the console in a browser and look at the end state.
    console: bool = False
    # Idempotent publishes and billing listener (markers + staged effects).
    idempotent: bool = False


@dataclass
class Summary:
    published: int = 0
    billed: int = 0
    deliveries: int = 0
    publish_retries: int = 0

    @property
    def duplicates(self) -> int:
        return self.deliveries - self.billed

    @property
    def lost(self) -> int:
        return self.published - self.billed


@dataclass
class _State:
    started: float = field(default_factory=time.monotonic)
    events: list[str] = field(default_factory=list)
    status: GroupStatus | None = None
    consumed: dict[int, int] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    summary: Summary = field(default_factory=Summary)
    migrating: bool = False

    def event(self, text: str) -> None:
        self.events.append(f"{time.monotonic() - self.started:5.1f}s  {text}")


def repo_root() -> Path:
    """The checkout holding ``samples/`` (the demo runs the sample app)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "samples" / "orders" / "app.py").exists():
        raise SystemExit(
            "streamkit demo runs samples/orders from a source checkout; "
            "install with `pip install -e .` from the repository"
        )
    return root


def run(options: DemoOptions, console: Console | None = None) -> int:
    """Run the demo; returns the process exit code (0 when nothing was lost)."""
    console = console or Console()
    root = repo_root()
    with contextlib.ExitStack() as stack:
        redis_url, cluster = options.services.redis_url, options.services.redis_cluster
        if redis_url is None:
            console.print("[bold]starting a private redis-server[/] (embedded default)")
            redis_url = stack.enter_context(RedisServer()).url
        password = secrets.token_urlsafe(12)
        console.print("[bold]starting the coordinator[/]")
        coordinator = stack.enter_context(
            CoordinatorProcess(
                redis_url,
                cluster=cluster,
                admin_password=password,
                port=options.services.port,
                heartbeat_interval_ms=HEARTBEAT_MS,
                member_lease_ttl_ms=LEASE_MS,
                rebalance_timeout_ms=10_000,
                tick_interval_ms=200,
                env={
                    "STREAMKIT_SERVER_PRODUCER_ROUTING_LEASE_MS": str(int(ROUTING_LEASE_S * 1000))
                },
            )
        )
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamkit-demo-")))
        env = _client_env(coordinator, redis_url, cluster)
        _print_console_hint(console, coordinator)
        interactive = options.console and console.is_terminal and sys.stdin.isatty()
        if interactive and not _wait_for_enter(console, "open the console, then press Enter"):
            return 130
        try:
            summary = anyio.run(_main, options, coordinator, env, root, logs, console)
        except KeyboardInterrupt:
            console.print("\n[yellow]interrupted: cleaning up[/]")
            return 130
        _print_summary(console, summary, options)
        if interactive:
            _wait_for_enter(console, "press Enter to stop the coordinator and Redis")
    return 0 if summary.lost == 0 else 1


def _print_console_hint(console: Console, coordinator: CoordinatorProcess) -> None:
    """Where to watch the demo in a browser, and how to sign in."""
    user, password = coordinator.admin_auth
    console.print(
        f"[bold]console:[/] {coordinator.url}/console/#/group/{ORDERS}/{BILLING}  "
        f"(sign in as [bold]{user}[/] with password [bold]{password}[/])",
        soft_wrap=True,  # a wrapped URL cannot be copied in one piece
    )


def _wait_for_enter(console: Console, prompt: str) -> bool:
    """False when the user interrupted instead (Ctrl-C or end of input)."""
    try:
        console.input(f"[bold]{prompt}[/] ")
    except (EOFError, KeyboardInterrupt):
        return False
    return True


def _client_env(coordinator: CoordinatorProcess, redis_url: str, cluster: bool) -> dict[str, str]:
    return {
        **client_env(coordinator, redis_url, cluster),
        "STREAMKIT_ROUTING_REFRESH_INTERVAL": "0.5",
        "STREAMKIT_ROUTING_LEASE": str(ROUTING_LEASE_S),
    }


@contextlib.contextmanager
def _consumer(
    name: str, env: dict[str, str], root: Path, logs: Path
) -> Iterator[subprocess.Popen[bytes]]:
    child_env = {**os.environ, **env, "STREAMKIT_MEMBER_ID_BASE": name}
    child_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(root), os.environ.get("PYTHONPATH")])
    )
    with open(logs / f"{name}.log", "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamkit", "run", SAMPLE_APP, "--log-level", "warning"],
            cwd=root,
            env=child_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops these itself
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _main(
    options: DemoOptions,
    coordinator: CoordinatorProcess,
    env: dict[str, str],
    root: Path,
    logs: Path,
    console: Console,
) -> Summary:
    state = _State()
    if options.idempotent:
        env = {**env, "SAMPLES_ORDERS_IDEMPOTENT": "1"}
    auth = coordinator.admin_auth
    async with httpx.AsyncClient(base_url=coordinator.url, auth=auth, timeout=10) as http:
        for prefix, group, shards in ((ORDERS, BILLING, options.shards), (INVOICES, ACCOUNTING, 4)):
            body = {"initialShardCount": shards, "requestedBy": "streamkit demo", "reason": "demo"}
            reply = await http.post(f"{API}/streams/{prefix}/groups/{group}", json=body)
            if reply.status_code not in (201, 409):
                raise SystemExit(f"could not create {prefix}/{group}: {reply.text}")
        state.event(f"created stream {ORDERS} with {options.shards} shards")
        redis = connect_redis(env["STREAMKIT_REDIS_URL"], cluster=options.services.redis_cluster)
        try:
            await redis.delete(BILLED)
            await redis.delete(DELIVERIES)
            with contextlib.ExitStack() as procs:
                consumers = {
                    name: procs.enter_context(_consumer(name, env, root, logs))
                    for name in ("consumer-a", "consumer-b")
                }
                state.event("started consumer-a and consumer-b (concurrency 2 each)")
                await _run_timeline(options, state, http, redis, env, consumers, console)
        finally:
            await redis.aclose()
    return state.summary


async def _run_timeline(
    options: DemoOptions,
    state: _State,
    http: httpx.AsyncClient,
    redis: AsyncRedis,
    env: dict[str, str],
    consumers: dict[str, subprocess.Popen[bytes]],
    console: Console,
) -> None:
    settings = StreamKitSettings(
        coordinator_url=env["STREAMKIT_COORDINATOR_URL"],
        coordinator_username=env["STREAMKIT_COORDINATOR_USERNAME"],
        coordinator_password=env["STREAMKIT_COORDINATOR_PASSWORD"],
        redis_url=env["STREAMKIT_REDIS_URL"],
        redis_cluster=options.services.redis_cluster,
        routing_refresh_interval=0.5,
        routing_lease=ROUTING_LEASE_S,
    )
    publish_until = state.started + options.duration * 0.8
    async with (
        CoordinatorClient.from_settings(settings) as coordinator_client,
        Publisher(
            ORDERS, BILLING, settings=settings, coordinator=coordinator_client, redis=redis
        ) as publisher,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(_publish, publisher, options, state, publish_until)
        tg.start_soon(_script, options, state, http, consumers)
        await _watch(options, state, coordinator_client, redis, console, publish_until)
        tg.cancel_scope.cancel()


def _order_json(order_id: str, amount: str) -> str:
    return json.dumps({"order_id": order_id, "amount": amount}, separators=(",", ":"))


async def _publish(publisher: Publisher, options: DemoOptions, state: _State, until: float) -> None:
    sequence = 0
    tick = 0.05
    per_tick = max(1, round(options.rate * tick))
    while time.monotonic() < until:
        batch = [
            (
                f"order-{sequence + i}",
                # The JSON payload the sample's typed handler decodes (its Order model).
                {"payload": _order_json(f"order-{sequence + i}", f"{(sequence + i) % 97}.00")},
            )
            for i in range(per_tick)
        ]
        try:
            # Idempotent: a batch sent again keeps the order ids, so the
            # orders already appended are not appended twice.
            ids = [key for key, _ in batch] if options.idempotent else None
            await publisher.publish_many(batch, idempotency_ids=ids)
        except (PublishError, RoutingUnavailable, RedisError, OSError) as exc:
            # At-least-once: the same order ids are sent again next tick.
            state.summary.publish_retries += 1
            state.event(f"publish retried: {type(exc).__name__}")
            await anyio.sleep(tick)
            continue
        sequence += per_tick
        state.summary.published = sequence
        await anyio.sleep(tick)


async def _script(
    options: DemoOptions,
    state: _State,
    http: httpx.AsyncClient,
    consumers: dict[str, subprocess.Popen[bytes]],
) -> None:
    await anyio.sleep(options.duration * 0.3)
    body = {"targetShardCount": options.scale_to, "requestedBy": "streamkit demo", "reason": "demo"}
    reply = await http.post(f"{API}/streams/{ORDERS}/scale", json=body)
    if reply.status_code == 202:
        state.event(f"scaling {ORDERS} from {options.shards} to {options.scale_to} shards")
    else:
        state.event(f"scale request answered {reply.status_code}: {reply.text[:120]}")
    await anyio.sleep(options.duration * 0.25)
    consumers["consumer-b"].kill()
    state.event("killed consumer-b (SIGKILL): its shards move once its lease runs out")


async def _watch(
    options: DemoOptions,
    state: _State,
    coordinator: CoordinatorClient,
    redis: AsyncRedis,
    console: Console,
    publish_until: float,
) -> None:
    deadline = state.started + options.duration
    drain_deadline = deadline + 30
    interactive = console.is_terminal
    last_print = 0.0
    printed_events = 0
    with (
        Live(_render(state, options), console=console, refresh_per_second=4, transient=False)
        if interactive
        else contextlib.nullcontext() as live
    ):
        while True:
            await _refresh(state, coordinator)
            now = time.monotonic()
            if live is not None:
                live.update(_render(state, options))
            else:
                # Plain log lines (CI, `| tee`): every event once, as it
                # happens, and a status line every 5 s; never wrapped.
                for event in state.events[printed_events:]:
                    _plain(console, event)
                printed_events = len(state.events)
                if now - last_print >= 5:
                    last_print = now
                    _plain(console, _status_line(state))
            drained = now > publish_until and state.status is not None and state.status.drained
            if (now >= deadline and drained) or now >= drain_deadline:
                break
            await anyio.sleep(0.5)
    if not interactive:
        for event in state.events[printed_events:]:
            _plain(console, event)
    if options.idempotent:
        # Per-shard effect keys (the sample's msg.effects.key(...)), summed.
        shards = [stream_key(ORDERS, s) for s in range(max(options.shards, options.scale_to))]
        state.summary.billed = sum([int(await redis.scard(slot_key(k, "billed"))) for k in shards])
        state.summary.deliveries = sum(
            [int(await redis.get(slot_key(k, "deliveries")) or 0) for k in shards]
        )
        return
    state.summary.billed = int(await redis.scard(BILLED))
    state.summary.deliveries = int(await redis.get(DELIVERIES) or 0)


def _plain(console: Console, line: str) -> None:
    console.print(line, soft_wrap=True, markup=False, highlight=False)


async def _refresh(state: _State, coordinator: CoordinatorClient) -> None:
    try:
        status = await fetch_status(coordinator, ORDERS, BILLING)
    except StreamkitError:
        return  # the coordinator is busy or restarting: show the last picture
    rates: dict[str, float] = {}
    for shard in status.shards:
        index = shard.shard.shard_index if shard.shard else -1
        consumed = (shard.stream_length or 0) - (shard.lag or 0) - (shard.pending_count or 0)
        delta = consumed - state.consumed.get(index, consumed)
        state.consumed[index] = consumed
        for owner in shard.owner_member_ids:
            rates[owner] = rates.get(owner, 0.0) + max(0, delta) / 0.5
    state.status = status
    state.rates = rates
    migration = status.group.active_migration
    if migration is None and state.migrating:
        state.migrating = False
        state.event(f"migration done: {status.group.shard_count} shards, old layout retired")
    if migration is not None:
        state.migrating = True
        key = f"migration {migration.state.value if migration.state else '?'}"
        if not any(key in event for event in state.events[-3:]):
            change = f"{migration.from_shard_count} -> {migration.to_shard_count} shards"
            state.event(f"{key} ({change})")


def _render(state: _State, options: DemoOptions) -> Group:
    elapsed = time.monotonic() - state.started
    head = (
        f"[bold]{ORDERS}/{BILLING}[/]  {elapsed:5.1f}s / {options.duration:.0f}s   "
        f"published {state.summary.published}"
    )
    events = Panel("\n".join(state.events[-6:]) or "-", title="events")
    if state.status is None:
        return Group(Panel(head), events)
    view = render(state.status, head=f"{head}   {headline(state.status)}", rates=state.rates)
    return Group(view, events)


def _status_line(state: _State) -> str:
    status = state.status
    if status is None:
        return f"{time.monotonic() - state.started:5.1f}s published={state.summary.published}"
    owners = sum(1 for s in status.shards if s.owner_member_ids)
    return (
        f"{time.monotonic() - state.started:5.1f}s published={state.summary.published} "
        f"shards={status.group.shard_count} owned={owners} members={len(status.members)} "
        f"assignmentEpoch={status.group.assignment_epoch}"
    )


def _print_summary(console: Console, summary: Summary, options: DemoOptions) -> None:
    if not console.is_terminal:
        _plain(
            console,
            f"summary: deliveries={summary.deliveries} publish_retries={summary.publish_retries}",
        )
        _plain(
            console,
            f"published={summary.published} acked={summary.billed} "
            f"duplicates={summary.duplicates} lost={summary.lost}",
        )
        return
    table = Table(title="streamkit demo summary")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("published", str(summary.published))
    table.add_row("acked (unique orders billed)", str(summary.billed))
    table.add_row("deliveries", str(summary.deliveries))
    what = "duplicate effects" if options.idempotent else "duplicates (redeliveries)"
    table.add_row(what, str(summary.duplicates))
    table.add_row("lost", str(summary.lost))
    console.print(table)
    console.print(
        f"published={summary.published} acked={summary.billed} "
        f"duplicates={summary.duplicates} lost={summary.lost}"
    )
