"""Prints the protocol simulation's coverage lines after the test run."""

from __future__ import annotations

import pytest

from .coverage import REPORT


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in REPORT:
        terminalreporter.write_line(line)
