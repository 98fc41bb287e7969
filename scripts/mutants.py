"""Mutation check: break one protocol rule at a time and show the simulation catches it.

Each mutant is a small exact text replacement in the member state machine or
the coordinator core.  The script copies the package to a temporary directory
(the working tree is never modified), applies one mutant there, runs the
protocol simulation against the copy and records whether it failed and how
long that took.  A mutant whose pattern no longer matches the source is an
error, not a pass: the core is edited often, so the patterns are kept small.

    .venv/bin/python scripts/mutants.py            # every mutant, prints a table
    .venv/bin/python scripts/mutants.py grant      # only mutants whose name contains "grant"
    .venv/bin/python scripts/mutants.py --check    # only check that every pattern applies

The run uses the simulation's pinned schedules, its fixed schedules, then its
fresh batch with ``STREAMKIT_SIM_SEED`` (default 1), without shrinking: the
time to catch is the time to the first failing schedule (pytest start-up
included).  The table goes into docs/testing.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEMBER = "streamkit/consumer/member.py"
DRAFT = "streamkit_server/core/draft.py"
DEADLINES = "streamkit_server/core/deadlines.py"
HEARTBEAT = "streamkit_server/core/heartbeat.py"
ROLLBACK = "streamkit_server/core/rollback.py"
LIMITS = "streamkit_server/core/limits.py"
WITNESS = "streamkit_server/core/witness.py"
PINNED = "tests/core/test_pinned_schedules.py"
SIMULATION = "tests/core/test_simulation.py"
#: Pinned schedules first (quick), then the fixed and the fresh random ones.
#: Not the expected failure: a mutant that made it pass would count as caught.
SIMULATION_TESTS = (
    f"{PINNED}::test_a_failover_that_lost_a_grant_only_another_process_saw",
    f"{PINNED}::test_a_late_previous_epoch_report_releases_nothing",
    f"{PINNED}::test_a_restore_from_before_a_handoff_starts_nothing_new",
    f"{PINNED}::test_a_report_from_a_lost_history_releases_no_shard_still_drained",
    f"{PINNED}::test_a_round_waits_for_the_drain_of_a_grant_redis_forgot",
    f"{PINNED}::test_a_full_record_cap_never_drops_a_fenced_member_that_still_reads",
    f"{SIMULATION}::test_fixed_schedules",
    f"{SIMULATION}::test_fresh_schedules",
)
#: Only the random batches: how the simulation does without the pinned ones.
RANDOM_TESTS = SIMULATION_TESTS[-2:]


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str
    #: (file, exact text, replacement); every text must occur exactly once.
    edits: tuple[tuple[str, str, str], ...]


MUTANTS = (
    Mutant(
        "lease-from-answer",
        "member lease counted from when the answer arrived, not from the send",
        (
            (
                MEMBER,
                "self.lease_until_ms = sent.sent_at_ms + lease",
                # The simulation publishes the answer's arrival time here.
                'self.lease_until_ms = globals().get("SIM_ARRIVAL_MS", sent.sent_at_ms) + lease',
            ),
        ),
    ),
    Mutant(
        "expire-early",
        "coordinator expires members 100 ms before their lease ends",
        (
            (
                DRAFT,
                "self.now > member.last_heartbeat_ms + cfg.member_lease_ttl_ms",
                "self.now > member.last_heartbeat_ms + cfg.member_lease_ttl_ms - 100",
            ),
            (
                DEADLINES,
                "deadlines.append(member.last_heartbeat_ms + ttl + 1)",
                "deadlines.append(member.last_heartbeat_ms + ttl - 99)",
            ),
        ),
    ),
    Mutant(
        "grant-ignores-holder",
        "a grant ignores the shard's current holder",
        (
            (
                DRAFT,
                "free = [s for s in self.group.pending_for(member_id) if s not in owners]",
                "free = self.group.pending_for(member_id)",
            ),
        ),
    ),
    Mutant(
        "correction-timer-kept",
        "a correction round's wait is not restarted by a new regression",
        ((DRAFT, '"started_at_ms": self.now,', ""),),
    ),
    Mutant(
        "correction-no-wait",
        "a correction round does not wait out a member lease",
        (
            (
                DRAFT,
                "if self.now < correction.started_at_ms + self.config.member_lease_ttl_ms:",
                "if self.now < correction.started_at_ms:",
            ),
        ),
    ),
    Mutant(
        "read-after-fenced",
        "a member keeps its read shards after FENCED",
        (
            (
                MEMBER,
                "lost = frozenset(self.reading | self.draining)\n        self.reading.clear()",
                "lost = frozenset(self.reading | self.draining)",
            ),
        ),
    ),
    Mutant(
        "fenced-released-at-once",
        "a fenced member's shards are released at once, not one lease later",
        (
            (
                DRAFT,
                "and self.now >= member.fenced_at_ms + cfg.member_lease_ttl_ms",
                "and self.now >= member.fenced_at_ms",
            ),
            (
                DEADLINES,
                "deadlines.append(member.fenced_at_ms + ttl)",
                "deadlines.append(member.fenced_at_ms)",
            ),
        ),
    ),
    Mutant(
        "sync-starts-shards",
        "SYNC_METADATA starts newly assigned shards",
        (
            (
                MEMBER,
                "if status is HeartbeatStatus.OK and not self.stopping:",
                "if status in (HeartbeatStatus.OK, HeartbeatStatus.SYNC_METADATA)"
                " and not self.stopping:",
            ),
        ),
    ),
    Mutant(
        "leave-ignores-incarnation",
        "a leave frees a member's shards whatever incarnation it carries (forged, stale)",
        (
            (
                HEARTBEAT,
                "if member is not None and not same_process(member, request.incarnation):\n"
                "        # A forged leave",
                "if False:\n        # A forged leave",
            ),
        ),
    ),
    Mutant(
        "join-ignores-incarnation",
        "a join from another process takes over a live member id",
        (
            (
                HEARTBEAT,
                "if existing is not None and not same_process(existing, request.incarnation):",
                "if existing is not None and not same_process(existing, request.incarnation)"
                " and False:",
            ),
        ),
    ),
    Mutant(
        "previous-epoch-as-current",
        "a report made before the member's current epoch (its previous epoch, or a version"
        " below the answer that carried the current one) is processed like a current one",
        (
            (
                HEARTBEAT,
                "if request.member_epoch == member.previous_member_epoch != member.member_epoch:",
                "if False:",
            ),
            (
                HEARTBEAT,
                "    if request.member_epoch != member.member_epoch:\n",
                "    if request.member_epoch not in"
                " (member.member_epoch, member.previous_member_epoch):\n",
            ),
            (HEARTBEAT, "if request.metadata_version < member.epoch_version:", "if False:"),
        ),
    ),
    Mutant(
        "server-change-ignored",
        "a write on another Redis server incarnation opens no correction round",
        ((ROLLBACK, "if server_changed and locked:", "if False:"),),
    ),
    Mutant(
        "forgotten-drain-ignored",
        "a correction round closes while a member still drains a shard Redis forgot",
        (
            (
                DRAFT,
                "            if member.live:\n                return\n            gone_at",
                "            gone_at",
            ),
        ),
    ),
    Mutant(
        "epochs-reissued",
        "member epochs counted on from Redis' counter (issued again after a rollback),"
        " and a report's version not checked against its epoch's answer",
        (
            (
                DRAFT,
                "epoch = max(self.group.last_issued_member_epoch + 1, epoch_floor(self.now))",
                "epoch = self.group.last_issued_member_epoch + 1",
            ),
            (DRAFT, "if self.group.last_issued_member_epoch < jump:", "if False:"),
            (HEARTBEAT, "if request.metadata_version < member.epoch_version:", "if False:"),
        ),
    ),
    Mutant(
        "epochs-from-counter",
        "member epochs counted on from Redis' counter alone (the version check kept)",
        (
            (
                DRAFT,
                "epoch = max(self.group.last_issued_member_epoch + 1, epoch_floor(self.now))",
                "epoch = self.group.last_issued_member_epoch + 1",
            ),
            (DRAFT, "if self.group.last_issued_member_epoch < jump:", "if False:"),
        ),
    ),
    Mutant(
        "grant-near-lease-end",
        "a shard is granted when its holder has under 100 ms of lease left",
        (
            (
                DRAFT,
                "free = [s for s in self.group.pending_for(member_id) if s not in owners]",
                "free = [\n"
                "            s\n"
                "            for s in self.group.pending_for(member_id)\n"
                "            if s not in owners\n"
                "            or self.group.members[owners[s]].last_heartbeat_ms\n"
                "            + self.config.member_lease_ttl_ms - self.now < 100\n"
                "        ]",
            ),
        ),
    ),
    Mutant(
        "release-while-draining",
        "a shard is released as soon as it is no longer read, though still draining",
        (
            (
                HEARTBEAT,
                "if shard not in owned and shard not in still_draining:",
                "if shard not in owned:",
            ),
        ),
    ),
    Mutant(
        "member-update-untracked",
        "a member record the core changed is missing from the changes the store writes",
        (
            (
                DRAFT,
                "        self._members_for_write()[member_id] = member\n"
                "        self.touched.add(member_id)",
                "        self._members_for_write()[member_id] = member",
            ),
        ),
    ),
    Mutant(
        "principal-ignored",
        "a member without an incarnation is not bound to the principal that joined it",
        (
            (
                HEARTBEAT,
                "    if request.incarnation is not None or principal is None:\n"
                "        return request\n",
                "    return request\n",
            ),
        ),
    ),
    Mutant(
        "evict-holders",
        "a join drops departed member records that still hold shards",
        ((LIMITS, "        and not group.shards_held_by(m.member_id)\n", ""),),
    ),
)


class PatternMissing(RuntimeError):
    pass


def mutated(mutant: Mutant, root: Path) -> dict[str, str]:
    """The new text of every file the mutant touches; raises when a pattern is off."""
    texts: dict[str, str] = {}
    for path, old, new in mutant.edits:
        text = texts.get(path) or (root / path).read_text()
        found = text.count(old)
        if found != 1:
            raise PatternMissing(
                f"mutant {mutant.name}: {old!r} occurs {found} times in {path}; "
                "the source changed, update the pattern in scripts/mutants.py"
            )
        texts[path] = text.replace(old, new)
    return texts


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns(".venv", ".git", "site", "__pycache__", ".hypothesis", "*.pyc")
    for name in ("streamkit", "streamkit_server", "tests"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


def simulate(
    copy: Path, seed: str, tests: tuple[str, ...] = SIMULATION_TESTS
) -> tuple[bool, float, str]:
    """Run the simulation on ``copy``: (caught, seconds, first failure line)."""
    env = dict(os.environ, PYTHONPATH=str(copy), STREAMKIT_SIM_SEED=seed, STREAMKIT_SIM_SHRINK="0")
    env.pop("PYTEST_ADDOPTS", None)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "-n",
        "0",  # in this process: -x and the time to the first failure mean something
        *tests,
    ]
    started = time.monotonic()
    result = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    if result.returncode not in (0, 1):
        raise RuntimeError(f"the simulation did not run (exit {result.returncode}):\n{output}")
    first = next((line[2:].strip() for line in output.splitlines() if line.startswith("E ")), "")
    return result.returncode == 1, elapsed, first


def imports_copy(copy: Path) -> None:
    """The copy, not the editable install, must be what the simulation imports."""
    probe = (
        "import streamkit.consumer.member, streamkit_server.core; "
        "print(streamkit_server.core.__file__)"
    )
    env = dict(os.environ, PYTHONPATH=str(copy))
    where = subprocess.run(
        [sys.executable, "-c", probe], cwd=copy, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    if not where.startswith(str(copy)):
        raise RuntimeError(f"the mutated copy is not imported (got {where})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", help="run only mutants whose name contains one of these")
    parser.add_argument(
        "--check", action="store_true", help="only check that every pattern applies"
    )
    parser.add_argument("--seed", default="1", help="STREAMKIT_SIM_SEED for the fresh batch")
    parser.add_argument(
        "--random-only",
        action="store_true",
        help="run only the random batches (fixed and fresh), not the pinned schedules",
    )
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or any(o in m.name for o in args.only)]
    try:
        for mutant in chosen:
            mutated(mutant, ROOT)  # every pattern must apply before anything runs
    except PatternMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"all {len(chosen)} mutants apply")
        return 0

    with tempfile.TemporaryDirectory(prefix="streamkit-mutants-") as tmp:
        copy = Path(tmp)
        copy_tree(copy)
        imports_copy(copy)
        tests = RANDOM_TESTS if args.random_only else SIMULATION_TESTS
        caught, elapsed, first = simulate(copy, args.seed, tests)
        if caught:
            print(f"the unmutated simulation fails: {first}", file=sys.stderr)
            return 2
        rows = [("(none)", "unmutated baseline", "passes", f"{elapsed:.1f}", "")]
        survivors = []
        for mutant in chosen:
            originals = {path: (copy / path).read_text() for path, _, _ in mutant.edits}
            for path, text in mutated(mutant, copy).items():
                (copy / path).write_text(text)
            try:
                caught, elapsed, first = simulate(copy, args.seed, tests)
            finally:
                for path, text in originals.items():
                    (copy / path).write_text(text)
            if not caught:
                survivors.append(mutant.name)
            verdict = "caught" if caught else "SURVIVED"
            rows.append((mutant.name, mutant.rule, verdict, f"{elapsed:.1f}", first[:90]))
            print(f"{mutant.name}: {verdict} in {elapsed:.1f} s", file=sys.stderr, flush=True)

    print("| mutant | rule broken | result | time to catch (s) | first failure |")
    print("|---|---|---|---:|---|")
    for row in rows:
        print("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    if survivors:
        print(f"\nsurvived: {', '.join(survivors)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
