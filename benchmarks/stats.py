"""Pure helpers: medians, targets (pass/miss) and the results table. No I/O, no timing."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that were measured (None = the run failed or was skipped)."""
    measured = [v for v in values if v is not None]
    return statistics.median(measured) if measured else None


@dataclass
class Measurement:
    """One benchmark row: every run's value, plus what the trace counted."""

    name: str
    unit: str = "s"
    runs: list[float | None] = field(default_factory=list)
    connections: int | None = None  # SSH connections per node (the most any node got)
    commands: int | None = None  # remote commands per node (the most any node got)
    note: str = ""

    @property
    def value(self) -> float | None:
        return median(self.runs)

    @property
    def round_trips(self) -> int | None:
        """Sequential round trips per node: each command >= 1 RTT, plus each connection setup."""
        if self.commands is None:
            return None
        return self.commands + (self.connections or 0)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "median": self.value, "runs": self.runs,
                "connections_per_node": self.connections, "commands_per_node": self.commands,
                "round_trips_per_node": self.round_trips, "note": self.note}


@dataclass(frozen=True)
class Target:
    """`measured <= limit` (or >= for `at_least`), where limit may be a multiple of another row."""

    name: str
    measured: str
    limit: float
    relative_to: str | None = None
    at_least: bool = False

    def evaluate(self, rows: dict[str, Measurement]) -> tuple[str, float | None, float | None]:
        """(status, measured value, limit in the measured unit); status pass|miss|n/a."""
        row = rows.get(self.measured)
        value = row.value if row else None
        limit: float | None = self.limit
        if self.relative_to is not None:
            base = rows.get(self.relative_to)
            limit = base.value * self.limit if base and base.value is not None else None
        if value is None or limit is None:
            return "n/a", value, limit
        ok = value >= limit if self.at_least else value <= limit
        return ("pass" if ok else "miss"), value, limit


def fmt(value: float | None, unit: str = "s") -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    if unit == "MB/s":
        return f"{value:.0f} MB/s"
    return f"{value:.2f} {unit}".strip()


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table (also readable on a terminal)."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *(line(r) for r in rows)])


def results_table(rows: list[Measurement]) -> str:
    body = [[r.name, fmt(r.value, r.unit), str(len([v for v in r.runs if v is not None])),
             "-" if r.connections is None else str(r.connections),
             "-" if r.commands is None else str(r.commands),
             "-" if r.round_trips is None else str(r.round_trips), r.note] for r in rows]
    return table(["benchmark", "median", "runs", "conn/node", "cmds/node", "RTs/node", "note"],
                 body)


def targets_table(targets: list[Target], rows: dict[str, Measurement]) -> str:
    body = []
    for target in targets:
        status, value, limit = target.evaluate(rows)
        unit = rows[target.measured].unit if target.measured in rows else "s"
        sign = ">=" if target.at_least else "<="
        body.append([target.name, fmt(value, unit), f"{sign} {fmt(limit, unit)}", status.upper()])
    return table(["target", "measured", "limit", "result"], body)
