"""Reading a $SPARKCTL_TRACE file (see orchestrator/transport.py: trace_event)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class TraceSummary:
    connections: dict[str, int]  # per node
    commands: dict[str, int]  # per node
    remote_seconds: float  # time with at least one connect/command in flight
    span_seconds: float  # first start to last end
    records: list[dict[str, Any]]

    @property
    def max_connections(self) -> int:
        return max(self.connections.values(), default=0)

    @property
    def max_commands(self) -> int:
        return max(self.commands.values(), default=0)

    def commands_matching(self, prefix: str) -> list[dict[str, Any]]:
        return [r for r in self.records
                if r["event"] == "command" and str(r.get("command", "")).startswith(prefix)]


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize(records: list[dict[str, Any]]) -> TraceSummary:
    connections = Counter(r["node"] for r in records if r["event"] == "connect")
    commands = Counter(r["node"] for r in records if r["event"] == "command")
    for node in set(connections) | set(commands):
        connections.setdefault(node, 0)
        commands.setdefault(node, 0)
    intervals = [(r["start"], r["end"]) for r in records]
    span = (max(e for _, e in intervals) - min(s for s, _ in intervals)) if intervals else 0.0
    return TraceSummary(dict(connections), dict(commands), union_seconds(intervals), span,
                        records)
