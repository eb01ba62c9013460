"""Progress for people, on stderr (stdout stays clean for --json)."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from orchestrator.core.report import StepResult

SYMBOL = {"ok": "·", "changed": "✓", "planned": "~", "failed": "✗", "skipped": "-"}


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
        if result.status in ("ok", "skipped"):
            return
        symbol = SYMBOL.get(result.status, "?")
        first_line = result.message.splitlines()[0] if result.message else ""
        self._print(f"        {symbol} {node} {result.step}: {first_line}")

    def note(self, message: str) -> None:
        self._print(message)
