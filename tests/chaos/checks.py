"""What a chaos run proves, computed from the records alone.

Inputs are the files the processes wrote (``app.py``, ``publisher.py``) plus
the harness' own log of what it did and when (kills, pauses, Redis data
loss).  Nothing here asks the coordinator or the Redis under test.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Read:
    shard: int
    reader: str  # member@pid: a restarted process is another reader
    epoch: int
    start_ns: int
    end_ns: int  # as recorded (or when the process was known dead)
    lease_ns: int  # when the lease the read relied on ended

    @property
    def held_until(self) -> int:
        """Until when the read could act in Redis: its end, but never past the
        lease it was sent under (a blocking read is shorter than the lease and
        abandoned when it ends; a paused process only *records* the end late)."""
        return min(self.end_ns, self.lease_ns)


@dataclass(frozen=True)
class Handling:
    seq: int
    key: str
    shard: int
    reader: str
    epoch: int
    t0: int
    t1: int
    entry_id: str
    redelivered: bool


@dataclass(frozen=True)
class Published:
    seq: int
    key: str
    shard: int
    entry_id: str
    t: int


@dataclass
class DataLoss:
    """Redis itself lost entries: a failover to a lagging replica, or a restart
    without persistence.  ``gone`` are the seqs Redis no longer held."""

    kind: str
    t_ns: int
    gone: set[int]


@dataclass
class FaultSpan:
    kind: str
    start_ns: int
    heal_ns: int


@dataclass
class Records:
    published: dict[int, list[Published]]
    reads: list[Read]
    handled: list[Handling]
    #: seq -> publish attempts Redis refused with OOM (nothing appended).
    refused: dict[int, int] = field(default_factory=dict)


def parse(
    publisher_file: Path, consumer_files: Iterable[Path], died_ns: Mapping[int, int], end_ns: int
) -> Records:
    published: dict[int, list[Published]] = defaultdict(list)
    refused: Counter[int] = Counter()
    if publisher_file.exists():
        for line in publisher_file.read_text().splitlines():
            p = line.split()
            if len(p) == 6 and p[0] == "P":
                published[int(p[1])].append(Published(int(p[1]), p[2], int(p[3]), p[4], int(p[5])))
            elif len(p) == 4 and p[0] == "R":
                refused[int(p[1])] += 1
    reads: list[Read] = []
    handled: list[Handling] = []
    for path in consumer_files:
        if not path.exists():  # killed before it wrote anything
            continue
        open_reads: dict[tuple[int, str], list[tuple[int, int, int]]] = defaultdict(list)
        for line in path.read_text().splitlines():
            p = line.split()
            if not p:
                continue
            if p[0] == "B" and len(p) == 7:
                reader = f"{p[2]}@{p[4]}"
                open_reads[(int(p[1]), reader)].append((int(p[3]), int(p[5]), int(p[6])))
            elif p[0] == "E" and len(p) == 7:
                key = (int(p[1]), f"{p[2]}@{p[4]}")
                epoch, start, lease = open_reads[key].pop(0)
                reads.append(Read(key[0], key[1], epoch, start, int(p[5]), lease))
            elif p[0] == "H" and len(p) == 11:
                handled.append(
                    Handling(
                        int(p[1]),
                        p[2],
                        int(p[3]),
                        f"{p[4]}@{p[6]}",
                        int(p[5]),
                        int(p[7]),
                        int(p[8]),
                        p[9],
                        p[10] == "1",
                    )
                )
        # A read with no end: the process died (or was still running) mid-read.
        for (shard, reader), left in open_reads.items():
            end = died_ns.get(int(reader.rsplit("@", 1)[1]), end_ns)
            reads.extend(Read(shard, reader, e, s, end, lease) for e, s, lease in left)
    return Records(dict(published), reads, handled, dict(refused))


def overlaps(reads: Iterable[Read]) -> list[tuple[Read, Read]]:
    """Pairs of reads of one shard by different readers whose holds overlap."""
    by_shard: dict[int, list[Read]] = defaultdict(list)
    for read in reads:
        by_shard[read.shard].append(read)
    bad: list[tuple[Read, Read]] = []
    for intervals in by_shard.values():
        intervals.sort(key=lambda r: r.start_ns)
        latest: dict[str, Read] = {}  # per reader, the read holding out longest so far
        for read in intervals:
            for reader, other in latest.items():
                if reader != read.reader and other.held_until > read.start_ns:
                    bad.append((other, read))
            prev = latest.get(read.reader)
            if prev is None or read.held_until > prev.held_until:
                latest[read.reader] = read
    return bad


@dataclass
class Verdict:
    published: int = 0
    handled: int = 0  # distinct seqs handled at least once
    lost: list[int] = field(default_factory=list)
    dropped_by_redis: dict[str, int] = field(default_factory=dict)
    duplicates: Counter[str] = field(default_factory=Counter)
    overlaps: list[tuple[Read, Read]] = field(default_factory=list)
    reads_without_lease: list[Read] = field(default_factory=list)
    order_violations: list[tuple[Handling, int]] = field(default_factory=list)
    reconvergence_s: dict[str, float] = field(default_factory=dict)
    last_reconvergence_s: float = 0.0
    #: Reads that recorded their end after their lease (paused or starved
    #: processes); held only until the lease in the overlap check.
    late_ends: int = 0
    #: Publish attempts Redis refused at maxmemory, and the seqs they were
    #: for (each published later by a retry, or never: not a loss, as Redis
    #: never accepted it).
    refused: int = 0
    refused_seqs: int = 0
    refused_never_published: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.overlaps or self.reads_without_lease or self.order_violations)

    @property
    def max_reconvergence_s(self) -> float:
        return max(self.reconvergence_s.values(), default=0.0)


def judge(records: Records, losses: list[DataLoss], faults: list[FaultSpan]) -> Verdict:
    v = Verdict()
    published = records.published
    v.published = len(published)
    first_handled: dict[int, int] = {}
    for h in sorted(records.handled, key=lambda h: h.t1):
        first_handled.setdefault(h.seq, h.t1)
    v.handled = len(set(first_handled) & set(published))
    v.refused = sum(records.refused.values())
    v.refused_seqs = len(records.refused)
    v.refused_never_published = sum(1 for s in records.refused if s not in published)

    # Loss: a published seq never handled, unless Redis itself lost it
    # (it was gone from the data set that survived a failover or restart).
    dropped: dict[int, str] = {}
    for loss in losses:
        for seq in loss.gone:
            if seq in published and seq not in first_handled:
                dropped.setdefault(seq, loss.kind)
    v.dropped_by_redis = dict(Counter(dropped.values()))
    v.lost = sorted(s for s in published if s not in first_handled and s not in dropped)

    # Duplicates, each with its reason.
    runs: dict[int, list[Handling]] = defaultdict(list)
    for h in records.handled:
        runs[h.seq].append(h)
    for seq, hs in runs.items():
        ids = {p.entry_id for p in published.get(seq, [])} | {h.entry_id for h in hs}
        if len(published.get(seq, [])) > 1 or len(ids) > 1:
            v.duplicates["publisher retry (two entries)"] += len(ids) - 1
        per_entry: dict[str, list[Handling]] = defaultdict(list)
        for h in sorted(hs, key=lambda h: h.t0):
            per_entry[h.entry_id].append(h)
        for runs_of_entry in per_entry.values():
            for earlier, again in itertools.pairwise(runs_of_entry):
                if again.redelivered:
                    reason = (
                        "claimed from another reader"
                        if again.reader != earlier.reader
                        else "claimed again by the same reader"
                    )
                else:
                    reason = "read as new again (Redis rolled back)"
                v.duplicates[reason] += 1

    # Reads must rely on a valid lease, and no two readers may hold a shard at once.
    v.reads_without_lease = [r for r in records.reads if r.start_ns >= r.lease_ns]
    v.late_ends = sum(1 for r in records.reads if r.end_ns > r.lease_ns)
    v.overlaps = overlaps(records.reads)

    # Per-key order within one reader's uninterrupted ownership of a shard: a
    # seq handled for the first time must not be lower than one already
    # handled for that key in the same run.
    seen: set[int] = set()
    by_shard: dict[int, list[Handling]] = defaultdict(list)
    for h in records.handled:
        by_shard[h.shard].append(h)
    for hs in by_shard.values():
        hs.sort(key=lambda h: h.t0)
        reader = None
        highest: dict[str, int] = {}
        for h in hs:
            if h.reader != reader:
                reader, highest = h.reader, {}
            top = highest.get(h.key, -1)
            if h.seq < top and h.seq not in seen:
                v.order_violations.append((h, top))
            highest[h.key] = max(top, h.seq)
            seen.add(h.seq)

    # Reconvergence: after a fault healed, how long until everything published
    # before the heal (and not dropped by Redis) was handled.
    pub_time = {s: min(p.t for p in ps) for s, ps in published.items()}
    for i, fault in enumerate(sorted(faults, key=lambda f: f.heal_ns)):
        backlog = [s for s, t in pub_time.items() if t <= fault.heal_ns and s not in dropped]
        done = [first_handled[s] for s in backlog if s in first_handled]
        if len(done) < len(backlog):
            value = float("inf")
        else:
            value = max(0.0, (max(done, default=fault.heal_ns) - fault.heal_ns) / 1e9)
        v.reconvergence_s[f"{i}:{fault.kind}"] = value
        v.last_reconvergence_s = value
    return v
