"""A private Redis Cluster on loopback: ``RedisCluster``, of ``RedisServer`` nodes.

Three primaries and no replicas by default (``redis-cli --cluster create``
refuses fewer primaries; ``replicas=1`` adds one replica per primary, which
the cluster promotes when its primary fails); ``start()`` returns once every node sees every other
node and all 16,384 slots are served, so a client bootstrapping from any node
gets the whole slot map.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from typing import Self

from streamkit.testing.process import CLUSTER_BUS_PORT_OFFSET, HOST, Launched
from streamkit.testing.redis_server import RedisServer, RedisServerError, which

__all__ = ["CLUSTER_SLOTS", "RedisCluster"]

CLUSTER_SLOTS = 16384


def _info_dict(raw: object) -> dict[str, str]:
    """Normalise a ``CLUSTER INFO`` reply (dict or raw text) to ``str -> str``."""
    if isinstance(raw, Mapping):
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


class RedisCluster(Launched):
    """A Redis Cluster of ``primaries`` primaries, each with ``replicas`` replicas, on loopback.

    Construction does not start anything; call :meth:`start` or use it as a
    context manager.
    """

    def __init__(
        self,
        primaries: int = 3,
        *,
        replicas: int = 0,
        extra_args: tuple[str, ...] = (),
        node_timeout_ms: int = 5000,
        startup_timeout: float = 60.0,
        executable: str | None = None,
        redis_cli: str | None = None,
        die_with_parent: bool = True,
    ) -> None:
        if primaries < 3:
            # redis-cli --cluster create refuses fewer than three primaries.
            raise ValueError("a Redis Cluster needs at least 3 primaries")
        self._redis_cli = which("redis-cli", redis_cli)
        self._startup_timeout = startup_timeout
        self.primaries = primaries
        self.replicas = replicas
        self.nodes: list[RedisServer] = []
        taken: set[int] = set()
        for _ in range(primaries * (1 + replicas)):
            node = RedisServer(
                cluster_enabled=True,
                cluster_node_timeout_ms=node_timeout_ms,
                executable=executable,
                extra_args=extra_args,
                die_with_parent=die_with_parent,
            )
            # free_port() probes one port at a time and lets it go, so two
            # nodes can be handed the same port, or one node's port can be
            # another's cluster bus port.
            while {node.port, node.port + CLUSTER_BUS_PORT_OFFSET} & taken:
                node._new_port()
            taken |= {node.port, node.port + CLUSTER_BUS_PORT_OFFSET}
            self.nodes.append(node)

    @property
    def url(self) -> str:
        """URL of the first node; cluster clients discover the rest from it."""
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(HOST, node.port) for node in self.nodes]

    def start(self) -> Self:
        """Start every node, create the cluster and wait until it is fully up."""
        try:
            for node in self.nodes:
                node.start()
            self._create()
            self._wait_until_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def flushall(self) -> None:
        """FLUSHALL every primary (a replica refuses writes and follows its primary)."""
        for node in self.current_primaries():
            node.flushall()

    def role(self, node: RedisServer) -> str:
        """``master`` or ``slave``, as the node itself says now (failovers change it)."""
        with node.client() as conn:
            reply = conn.execute_command("ROLE")
        role = reply[0]
        return role.decode() if isinstance(role, bytes) else str(role)

    def current_primaries(self) -> list[RedisServer]:
        """The running nodes that are primaries now."""
        return [n for n in self.nodes if n.is_running() and self.role(n) == "master"]

    def cluster_info(self, node: RedisServer) -> dict[str, str]:
        with node.client() as conn:
            return _info_dict(conn.execute_command("CLUSTER INFO"))

    def _create(self) -> None:
        cmd = [
            self._redis_cli,
            "--cluster", "create",
            *(f"{HOST}:{node.port}" for node in self.nodes),
            "--cluster-replicas", str(self.replicas),
            "--cluster-yes",
        ]  # fmt: skip
        try:
            result = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self._startup_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RedisServerError(
                f"redis-cli --cluster create timed out after {self._startup_timeout:.0f}s"
            ) from exc
        # redis-cli reports some failures with exit code 0, so also look for
        # its success banner.
        if result.returncode != 0 or "All 16384 slots covered" not in result.stdout:
            raise RedisServerError(
                f"redis-cli --cluster create failed (exit {result.returncode}):\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-2000:]}"
            )

    def _wait_until_ok(self) -> None:
        expected = {
            "cluster_state": "ok",
            "cluster_slots_assigned": str(CLUSTER_SLOTS),
            "cluster_slots_ok": str(CLUSTER_SLOTS),
            # Every node must know every other node and see all primaries
            # serving slots, or a client bootstrapping from it gets a partial
            # slot map.
            "cluster_known_nodes": str(len(self.nodes)),
            "cluster_size": str(self.primaries),
        }
        deadline = time.monotonic() + self._startup_timeout
        last: dict[int, dict[str, str]] = {}
        while time.monotonic() < deadline:
            last = {node.port: self.cluster_info(node) for node in self.nodes}
            if all(
                all(info.get(key) == value for key, value in expected.items())
                for info in last.values()
            ):
                return
            time.sleep(0.1)
        summary = {port: {key: info.get(key) for key in expected} for port, info in last.items()}
        raise RedisServerError(
            f"cluster did not converge within {self._startup_timeout:.0f}s: {summary}"
        )

    def is_running(self) -> bool:
        return all(node.is_running() for node in self.nodes)

    def close(self) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<RedisCluster {', '.join(f'{h}:{p}' for h, p in self.startup_nodes)}>"
