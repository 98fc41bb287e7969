"""``streamkit dev app:app``: the local loop in one command.

It starts a private ``redis-server`` (unless ``--redis-url`` names one) and a
coordinator with a generated admin password, points the app at them, creates
the streams and groups the app uses (its declared shard counts; the
coordinator's default for streams it does not declare), and serves the app
like ``streamkit run``.  Ctrl-C drains the app first, then stops the
coordinator and Redis, so nothing is left running and no port stays taken.

It prints what a second terminal needs to publish or look (``export ...``),
and with ``--env-file`` also writes it to a file the ``streamkit`` commands
and apps of that directory read (``.env``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from streamkit.demo.services import LocalServices
from streamkit.errors import StreamkitError

if TYPE_CHECKING:
    from streamkit.app import StreamKit
    from streamkit.testing.coordinator import CoordinatorProcess

__all__ = ["DevError", "DevOptions", "client_env", "run_dev"]

log = logging.getLogger("streamkit.dev")

#: Marks a settings file this command wrote (and may overwrite and remove).
_MARKER = "# written by `streamkit dev`; removed when it stops\n"
#: The second line: which process wrote it, so a second ``streamkit dev`` in
#: the same directory neither takes over nor removes a live one's file.
_OWNER = "# pid {pid}\n"
_OWNER_LINE = re.compile(r"^# pid (\d+)$", re.MULTILINE)
# A local loop wants a quick rebalance when a second process joins, not the
# production 3 s heartbeats and 15 s lease.
_HEARTBEAT_MS, _LEASE_MS, _REBALANCE_MS, _TICK_MS = 1_000, 5_000, 10_000, 250


class DevError(StreamkitError):
    """``streamkit dev`` cannot set up its Redis or coordinator."""


@dataclass(frozen=True)
class DevOptions:
    target: str
    services: LocalServices = field(default_factory=LocalServices)
    env_file: Path | None = None
    http: str | None = None


def run_dev(options: DevOptions) -> int:
    """Run until Ctrl-C (or SIGTERM); the exit status."""
    from streamkit.cli.run import serve_until_signalled
    from streamkit.cli.target import load_app, parse_target

    parse_target(options.target, "dev")  # a typo fails before anything starts
    # As would a taken port or settings file: before Redis starts, not after.
    services = options.services
    if services.port is not None:
        _check_port(services.port)
    if options.env_file is not None:
        _check_settings_file(options.env_file, options.target)
    with contextlib.ExitStack() as stack:
        redis_url = services.redis_url or _private_redis(stack)
        password = secrets.token_urlsafe(12)
        coordinator = _coordinator(stack, redis_url, options, password)
        settings = client_env(coordinator, redis_url, services.redis_cluster)
        _announce(coordinator.url, redis_url, services.redis_url is None, password, settings)
        if options.env_file is not None:
            stack.enter_context(_settings_file(options.env_file, settings, options.target))
        # The app reads its settings when its module creates it: set them first.
        os.environ.pop("STREAMKIT_COORDINATOR_TOKEN", None)
        os.environ.update(settings)
        app = load_app(options.target, command="dev")
        for prefix in _undeclared_streams(app):
            log.info(
                "creating stream %r with the coordinator's default shard count if missing "
                "(declare it to choose: app.stream(%r, shards=N))",
                prefix,
                prefix,
            )
            app.stream(prefix)
        status = serve_until_signalled(app, options.http)
    what = "the coordinator and Redis" if options.services.redis_url is None else "the coordinator"
    log.info("stopped the app, %s", what)
    return status


def client_env(coordinator: CoordinatorProcess, redis_url: str, cluster: bool) -> dict[str, str]:
    """The ``STREAMKIT_*`` settings of a client of ``coordinator`` (as its admin)."""
    user, password = coordinator.admin_auth
    return {
        "STREAMKIT_COORDINATOR_URL": coordinator.url,
        "STREAMKIT_COORDINATOR_USERNAME": user,
        "STREAMKIT_COORDINATOR_PASSWORD": password,
        "STREAMKIT_REDIS_URL": redis_url,
        "STREAMKIT_REDIS_CLUSTER": "true" if cluster else "false",
    }


def _private_redis(stack: contextlib.ExitStack) -> str:
    from streamkit.testing.redis_server import RedisNotInstalledError, RedisServer

    try:
        server = RedisServer()
    except RedisNotInstalledError as exc:
        raise DevError(f"{exc}; or pass --redis-url to use a Redis you run") from None
    return stack.enter_context(server).url


def _coordinator(
    stack: contextlib.ExitStack, redis_url: str, options: DevOptions, password: str
) -> CoordinatorProcess:
    from streamkit.testing.coordinator import CoordinatorProcess, CoordinatorProcessError
    from streamkit.testing.process import PortTakenError

    process = CoordinatorProcess(
        redis_url,
        cluster=options.services.redis_cluster,
        admin_password=password,
        # Generated once in Redis, as in production (not the tests' fixed secret).
        token_secret=None,
        port=options.services.port,
        heartbeat_interval_ms=_HEARTBEAT_MS,
        member_lease_ttl_ms=_LEASE_MS,
        rebalance_timeout_ms=_REBALANCE_MS,
        tick_interval_ms=_TICK_MS,
    )
    try:
        return stack.enter_context(process)
    except PortTakenError:  # taken between _check_port and the coordinator's bind
        raise DevError(_port_taken(process.port)) from None
    except CoordinatorProcessError as exc:
        raise DevError(f"the coordinator did not start: {_reason(str(exc))}") from None


def _reason(output: str) -> str:
    """The line of a failed coordinator's output that says why (not uvicorn's last words)."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "cannot start" in line or "error" in line.lower():
            return line
    return lines[-1] if lines else "no output"


def _port_taken(port: int) -> str:
    return (
        f"port {port} is taken (another streamkit dev or coordinator?); "
        "pass another --port, or none to use a free one"
    )


def _check_port(port: int) -> None:
    from streamkit.testing.process import HOST

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As uvicorn binds: a port in TIME_WAIT (a dev that just stopped) is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            raise DevError(_port_taken(port)) from None


def _announce(url: str, redis_url: str, private: bool, password: str, env: dict[str, str]) -> None:
    from streamkit.connections import redacted_url

    where = "a private redis-server, gone at exit" if private else "yours"
    exports = " ".join(f"{name}={value}" for name, value in env.items())
    lines = [
        f"streamkit dev: Redis {redacted_url(redis_url)} ({where}), coordinator {url}",
        f"console: {url}/console/  (user admin, password {password}: shown only now)",
        "in another terminal, to publish or look with these settings:",
        f"export {exports}",
    ]
    print("\n".join(lines), flush=True)


def _owner(text: str) -> int | None:
    """The pid of the ``streamkit dev`` that wrote a settings file, if it still runs."""
    found = _OWNER_LINE.search(text)
    if found is None:
        return None  # an older release's file, or a damaged one: its writer is gone
    pid = int(found[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # left behind by a dev that was killed: ours to replace
    except PermissionError:
        pass  # alive, another user's
    with contextlib.suppress(OSError):  # Linux: a reused pid is not a streamkit dev
        if b"streamkit" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return None
    return pid


def _check_settings_file(path: Path, target: str) -> bool:
    """Refuse a file that is not ours, or that a running ``streamkit dev`` uses;
    whether there is a stale one (of a ``streamkit dev`` that is gone)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise DevError(f"cannot read --env-file {path}: {exc.strerror}") from None
    if not text.startswith(_MARKER):
        raise DevError(
            f"--env-file {path} exists and was not written by streamkit dev; "
            "name another file, or move it away"
        )
    pid = _owner(text)
    if pid is not None and pid != os.getpid():
        url = re.search(r"^STREAMKIT_COORDINATOR_URL=(\S+)$", text, re.MULTILINE)
        where = f", coordinator {url[1]}" if url else ""
        raise DevError(
            f"{path} belongs to the streamkit dev running as pid {pid}{where}; to run a "
            f"second copy of the app with it, run `streamkit run {target}` in this "
            "directory (it reads that file); for a setup of its own, pass another --env-file"
        )
    return True


@contextlib.contextmanager
def _settings_file(path: Path, env: dict[str, str], target: str) -> Iterator[None]:
    """Write ``env`` to ``path``, and remove it at exit if it is still ours."""
    # Again: another dev may have started meanwhile.
    if _check_settings_file(path, target):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # stale: replaced, not written into
    mine = _MARKER + _OWNER.format(pid=os.getpid())
    try:
        # Exclusive: of two devs started at the same moment, one writes it.
        with path.open("x", encoding="utf-8") as file:
            file.write(mine + "".join(f"{k}={v}\n" for k, v in env.items()))
    except FileExistsError:
        _check_settings_file(path, target)  # names the dev that was first
        raise DevError(f"--env-file {path} appeared meanwhile; start again") from None
    print(f"(also written to {path}, which streamkit commands in that directory read)")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if path.read_text(encoding="utf-8").startswith(mine):
                path.unlink()


def _undeclared_streams(app: StreamKit) -> list[str]:
    declared = {d.stream_prefix for d in app.declared_streams()}
    used = [x.stream_prefix for x in app.listeners] + [p.stream_prefix for p in app.publishers]
    return [prefix for prefix in dict.fromkeys(used) if prefix not in declared]
