"""Speculative-decoding meters: how an engine's /metrics tells how many drafted tokens were
accepted during a benchmark cell (`Engine.spec_meter`; `sparkctl bench` reads it through its
forward). The base reads nothing; each engine's folder has its own (meter.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Fetch = Callable[[], str]
"""GET /metrics through the forward; returns the body (raises OSError on failure)."""

PROM_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFNa]+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name -> sum over its label sets (comments and bad lines skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = PROM_LINE.match(line.strip())
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        out[match.group(1)] = out.get(match.group(1), 0.0) + value
    return out


def counter(values: dict[str, float], name: str) -> float | None:
    for key in (name + "_total", name):
        if key in values:
            return values[key]
    return None


class SpecMeter:
    """begin() at a cell's start, poll() while it runs, end() -> figures or None."""

    source = ""

    def __init__(self, fetch: Fetch) -> None:
        self.fetch = fetch
        self.note: str | None = None

    def read(self) -> str | None:
        try:
            return self.fetch()
        except OSError as exc:
            self.note = f"/metrics unreadable: {exc}"
            return None

    def begin(self) -> None: ...

    def poll(self) -> None: ...

    def end(self) -> dict[str, Any] | None:
        return None
