"""Coverage counters for the protocol simulation, and the session report.

A simulation that spends its checks in quiet states proves little, so the
simulation counts in which states its checks happened and prints one line per
run at the end of the pytest session (``report``), visible even under ``-q``.
"""

from __future__ import annotations

from collections import Counter

#: Lines printed in the terminal summary (see ``tests/core/conftest.py``).
REPORT: list[str] = []

#: The order of the coverage line; other counters follow alphabetically.
HEADLINE = (
    "handoffs",
    "revokes_in_flight",
    "corrections_with_holders",
    "reshards_both_layouts",
    "late_deliveries_checked",
    "regressions_detected",
    "rollbacks",
    "fenced",
    "members_fenced",
)


class SimulationCoverage:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def reset(self) -> None:
        self._counts.clear()

    def count(self, name: str) -> None:
        self._counts[name] += 1

    def __getitem__(self, name: str) -> int:
        return self._counts[name]

    def fraction(self, name: str) -> float:
        """``name`` as a share of all invariant checks."""
        checks = self._counts["checks"]
        return self._counts[name] / checks if checks else 0.0

    def line(self) -> str:
        rest = sorted(set(self._counts) - set(HEADLINE) - {"contended", "checks", "examples"})
        parts = [f"contended={self.fraction('contended'):.2f}"]
        parts += [f"{name}={self._counts[name]}" for name in (*HEADLINE, *rest)]
        parts += [f"checks={self._counts['checks']}", f"examples={self._counts['examples']}"]
        return " ".join(parts)


def report(line: str) -> None:
    print(line)
    REPORT.append(line)
