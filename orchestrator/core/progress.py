"""Progress for people, on stderr (stdout stays clean for --json)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from orchestrator.core.report import StepResult, worth_showing

SYMBOL = {"ok": "·", "changed": "✓", "planned": "~", "failed": "✗", "skipped": "-"}
LOG = logging.getLogger("sparkctl.progress")
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


HEARTBEAT_SECONDS = 12.0
"""The longest silence a long wait keeps: a line at least this often (what, elapsed, bytes)."""


def elapsed_text(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Heartbeat:
    """A long wait that says something at least every `every` seconds, even while the command
    it waits for prints nothing (a registry slow to answer, an engine loading weights).

    Lines go through `note` (the progress stream) and into the run log; `say` is the note for
    the wait's own lines: each one resets the silence, so a chatty wait gets no extra lines.
    `detail` adds what is known so far (layers, bytes) to the heartbeat line."""

    def __init__(self, note: Callable[[str], None], what: str, every: float | None = None,
                 detail: Callable[[], str] | None = None) -> None:
        self.note, self.what, self.detail = note, what, detail
        self.every = HEARTBEAT_SECONDS if every is None else every
        self.started = self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")

    def say(self, line: str) -> None:
        self.last = time.monotonic()
        LOG.info("%s", line.strip())
        self.note(line)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            if time.monotonic() - self.last >= self.every:
                extra = self.detail() if self.detail else ""
                self.say(f"          … {self.what}: waiting, {elapsed_text(self.elapsed())}"
                         + (f"; {extra}" if extra else ""))

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
