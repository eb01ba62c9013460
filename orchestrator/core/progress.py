"""Progress for people, on stderr (stdout stays clean for --json)."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from orchestrator.core.report import StepResult, worth_showing

SYMBOL = {"ok": "·", "changed": "✓", "planned": "~", "failed": "✗", "skipped": "-"}
PROOF = "✓"
"""A verify step that proved something (mpirun reached every node, the network confirmed)."""


class Progress:
    def __init__(self, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def _print(self, line: str) -> None:
        if self.quiet:
            return
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    def phase(self, name: str, nodes: int) -> None:
        elapsed = time.monotonic() - self.started
        self._print(f"[{elapsed:5.1f}s] phase {name} on {nodes} node(s)")

    def step(self, node: str, result: StepResult) -> None:
        """A line for every step that changed, failed, would change or proved something, and
        for a fine step whose message says something of the user's was left alone: off a
        terminal these lines are the record of the run (core/output.py)."""
        if result.status in ("ok", "skipped") and not (result.proof or worth_showing(result.message)):
            return
        symbol = PROOF if result.proof else SYMBOL.get(result.status, "?")
        first_line = result.message.splitlines()[0] if result.message else ""
        self._print(f"        {symbol} {node} {result.step}: {first_line}")

    def note(self, message: str) -> None:
        self._print(message)
