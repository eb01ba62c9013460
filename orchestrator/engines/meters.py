"""Speculative-decoding meters: how an engine's /metrics tells how many drafted tokens were
accepted during a benchmark cell (`Engine.spec_meter`; `sparkctl bench` reads it through its
forward). The base reads nothing; each engine's folder has its own (meter.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Fetch = Callable[[], str]
"""GET /metrics through the forward; returns the body (raises OSError on failure)."""

def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> sum over its label sets, read by prometheus_client's parser (the
    reference one: escapes, timestamps, exemplars). A line it refuses costs only that line."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return _sums(text_string_to_metric_families(text))
    except ValueError:
        pass
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            try:
                for name, value in _sums(text_string_to_metric_families(line + "\n")).items():
                    out[name] = out.get(name, 0.0) + value
            except ValueError:
                continue
    return out


def _sums(families: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def counter(values: dict[str, float], name: str) -> float | None:
    for key in (name + "_total", name):
        if key in values:
            return values[key]
    return None


class SpecMeter:
    """begin() at a cell's start, poll() while it runs, end() -> figures or None."""

    source = ""
    prometheus = False
    """/metrics is Prometheus text that reading leaves alone (status reads it too)."""

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


class CounterMeter(SpecMeter):
    """Prometheus counters of drafts, drafted and accepted tokens (NAMES, in that order): their
    deltas over a cell (vLLM's and llama.cpp's shape)."""

    prometheus = True
    NAMES: tuple[str, ...] = ()
    MISSING = "no speculative-decoding counters in /metrics (no drafting)"

    def snapshot(self) -> list[float | None]:
        text = self.read()
        values = parse_prometheus(text or "")
        return [counter(values, name) for name in self.NAMES]

    def begin(self) -> None:
        self.start = self.snapshot()

    def end(self) -> dict[str, Any] | None:
        finish = self.snapshot()
        if any(v is None for v in [*self.start, *finish]):
            self.note = self.note or self.MISSING
            return None
        drafts, drafted, accepted = (b - a for a, b in zip(self.start, finish, strict=True))  # type: ignore[operator]
        if drafted <= 0 or drafts <= 0:
            self.note = "no draft tokens during the cell"
            return None
        return {"acceptance_rate": accepted / drafted, "acceptance_length": 1 + accepted / drafts,
                "draft_tokens": int(drafted), "accepted_tokens": int(accepted),
                "drafts": int(drafts), "source": self.source}


def meter_class(engine: str) -> type[SpecMeter]:
    """The engine's meter (Engine.spec_meter); an unknown engine's reads nothing."""
    from orchestrator.engines import REGISTRY, get_engine
    from orchestrator.engines.capabilities import spec_meter

    return (spec_meter(get_engine(engine)) if engine in REGISTRY else None) or SpecMeter


def meter_for(engine: str, fetch: Fetch) -> SpecMeter:
    return meter_class(engine)(fetch)
