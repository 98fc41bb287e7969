"""The core's steady-heartbeat decision alone, by group size (no Redis, no HTTP).

Run: python bench/core_heartbeat.py [--rounds 9]

Builds settled groups in memory with the pure core (every member joined,
owns its target shards, nothing pending) and times ``handle_heartbeat`` for
steady heartbeats, each member in turn, the clock advancing as members at
the default 3 s interval would.  Prints the CPU time per heartbeat (median of
the rounds) and its ratio to the 10-member group whose members hold as many
shards each, in the same run: the decision should cost what the member
holds, not what the group holds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from streamkit.protocol import (
    HeartbeatRequest,
    HeartbeatStatus,
    RuntimeConsumerCapacity,
    shard_ids,
)
from streamkit_server.core import CoordinatorConfig, GroupMetadata, handle_heartbeat, new_group

CONFIG = CoordinatorConfig()
# (members, shards): pairs with as many shards per member (1, 4), and the
# bench's 16-shard groups (bench/heartbeat.py, bench/fleet.py).
SHAPES = [(10, 10), (1_000, 1_000), (10, 40), (1_000, 4_000), (10, 16), (100, 16), (1_000, 16)]


def _request(member: str, epoch: int, version: int, owned: list[int]) -> HeartbeatRequest:
    return HeartbeatRequest(
        protocol_version=1,
        request_id="r",
        member_id=member,
        member_epoch=epoch,
        metadata_version=version,
        runtime_consumer_capacity=RuntimeConsumerCapacity(
            runtime_max_concurrency=1, available_concurrency=1
        ),
        owned_shards=shard_ids(owned),
    )


class Fleet:
    """A settled group and the steady request of each member."""

    def __init__(self, members: int, shards: int) -> None:
        self.ids = [f"m{i:05d}" for i in range(members)]
        self.step_ms = max(1, CONFIG.heartbeat_interval_ms // members)
        self.now = 1_000
        self.group: GroupMetadata = new_group("bench", "g", shards, 0)
        state = {m: (0, 0, []) for m in self.ids}  # epoch, version, owned
        for _ in range(12):
            changed = False
            for m in self.ids:
                epoch, version, owned = state[m]
                answer = self._beat(_request(m, epoch, version, owned))
                view = answer.assignment
                assert view is not None and answer.member_epoch is not None
                new = (
                    answer.member_epoch,
                    answer.metadata_version or 0,
                    [s.shard_index for s in view.assigned_shards],
                )
                changed |= new != state[m] or bool(view.pending_shards)
                state[m] = new
            if not changed:
                break
        else:
            raise RuntimeError("group did not settle")
        self.requests = [_request(m, *state[m]) for m in self.ids]

    def _beat(self, request: HeartbeatRequest) -> object:
        self.now += self.step_ms
        result = handle_heartbeat(self.group, request.member_id, request, self.now, CONFIG)
        self.group = result.state or self.group
        return result.response

    def round(self, beats: int) -> float:
        """CPU seconds per steady heartbeat over ``beats`` heartbeats."""
        requests = self.requests
        started = time.process_time()
        for i in range(beats):
            request = requests[i % len(requests)]
            self.now += self.step_ms
            result = handle_heartbeat(self.group, request.member_id, request, self.now, CONFIG)
            self.group = result.state or self.group
        elapsed = time.process_time() - started
        assert result.response.status is HeartbeatStatus.OK
        return elapsed / beats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--beats", type=int, default=2_000, help="heartbeats per round")
    args = parser.parse_args()
    fleets = {shape: Fleet(*shape) for shape in SHAPES}
    samples: dict[tuple[int, int], list[float]] = {shape: [] for shape in SHAPES}
    for _ in range(args.rounds):  # shapes interleaved, so the machine's drift hits all
        for shape, fleet in fleets.items():
            samples[shape].append(fleet.round(args.beats))
    medians = {shape: statistics.median(values) for shape, values in samples.items()}
    print(f"steady heartbeat decision (handle_heartbeat), CPU per heartbeat, "
          f"median of {args.rounds} rounds of {args.beats}")  # fmt: skip
    print(f"{'members x shards':>18}  {'us/heartbeat':>12}  ratio to 10 members, same shards each")
    for (members, shards), median in medians.items():
        base = medians.get((10, shards * 10 // members))
        ratio = f"{median / base:.2f}x" if base is not None and members != 10 else ""
        print(f"{members:>8,} x {shards:<7,}  {median * 1e6:>12.1f}  {ratio}")


if __name__ == "__main__":
    main()
