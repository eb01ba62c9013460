"""Shared test plumbing: the tally the reliability suite prints at the end of `make test`.

Tests that prove a promise count what they proved (`tally.add("inputs fuzzed", n)`), and the
summary shows one line per category, so a run says how much was proven, not only that it passed.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

_TALLY: Counter[str] = Counter()


class Tally:
    def add(self, category: str, count: int = 1) -> None:
        _TALLY[category] += count


@pytest.fixture
def tally() -> Tally:
    return Tally()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _TALLY:
        return
    terminalreporter.section("sparkctl reliability tally")
    for category in sorted(_TALLY):
        terminalreporter.write_line(f"{category}: {_TALLY[category]}")



# Subprocesses (`python -m orchestrator.cli`, `python -m sparklab.cli`) import the tree under
# test, not whatever checkout happens to be installed in the venv.
_REPO = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join([str(_REPO), str(_REPO / "lab")])
