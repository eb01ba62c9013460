"""The outcome of a run: per host, per step; rendered as a table, as JSON, as an exit code."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from orchestrator.errors import EXIT_FAILED, EXIT_OK

Status = Literal["ok", "changed", "failed", "skipped", "planned"]


@dataclass
class StepResult:
    phase: str
    step: str
    status: Status
    seconds: float = 0.0
    message: str = ""
    diff: str = ""
    commands: tuple[str, ...] = ()
    """What the step runs (or, planned, would run) on the node."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase, "step": self.step, "status": self.status,
            "seconds": round(self.seconds, 3), "message": self.message,
        }
        if self.diff:
            out["diff"] = self.diff
        if self.commands:
            out["commands"] = list(self.commands)
        return out


@dataclass
class HostReport:
    steps: list[StepResult] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(s.status != "failed" for s in self.steps)


@dataclass
class Report:
    command: str
    hosts: dict[str, HostReport] = field(default_factory=dict)
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """Lines for the user after the table (what changed on a failure, what to do next)."""

    def host(self, name: str) -> HostReport:
        return self.hosts.setdefault(name, HostReport())

    def add(self, node: str, result: StepResult) -> None:
        self.host(node).steps.append(result)

    def fail_host(self, node: str, message: str) -> None:
        self.host(node).error = message

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts.values())

    def count(self, status: Status) -> int:
        return sum(1 for h in self.hosts.values() for s in h.steps if s.status == status)

    @property
    def failures(self) -> int:
        """Failed steps plus nodes that could not be reached at all."""
        return self.count("failed") + sum(1 for h in self.hosts.values() if h.error)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_FAILED

    def to_json(self) -> dict[str, Any]:
        hosts = {}
        for name, host in self.hosts.items():
            entry: dict[str, Any] = {"ok": host.ok, "steps": [s.to_json() for s in host.steps]}
            if host.error:
                entry["error"] = host.error
            hosts[name] = entry
        return {
            "command": self.command,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "changed": self.count("changed") + self.count("planned"),
            "failed": self.failures,
            "hosts": hosts,
            **({"notes": list(self.notes)} if self.notes else {}),
            **self.extra,
        }


def print_json(payload: dict[str, Any], stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(json.dumps(payload, indent=2, sort_keys=False) + "\n")


STATUS_STYLE = {
    "ok": "green", "changed": "yellow", "planned": "cyan", "failed": "bold red", "skipped": "dim",
}


ALWAYS_SHOWN = ("left alone", "skipped:", "unknown")
"""Rows whose message says sparkctl left something of the user's alone (or could not look) are
shown even when the step was otherwise fine: the user must know."""


def worth_showing(message: str) -> bool:
    return any(marker in message for marker in ALWAYS_SHOWN)


def render_table(report: Report, show_diffs: bool = False, verbose: bool = False) -> None:
    """Print the report for people: a row per step that did something (all rows with -v)."""
    from rich.console import Console
    from rich.table import Table

    # Piped output (CI logs, `| less`) gets a wide table instead of rich's 80-column default.
    console = Console(stderr=False, highlight=False, width=None if sys.stdout.isatty() else 160)
    table = Table(title=f"sparkctl {report.command}", show_lines=False, expand=False)
    for column in ("node", "phase", "step", "status", "time", "message"):
        table.add_column(column, overflow="fold")
    quiet_ok = 0
    for node, host in report.hosts.items():
        if host.error:
            table.add_row(node, "-", "connect", "[bold red]failed[/]", "", host.error)
        for step in host.steps:
            if (step.status in ("ok", "skipped") and not verbose and len(report.hosts) > 1
                    and not worth_showing(step.message)):
                quiet_ok += 1
                continue
            style = STATUS_STYLE.get(step.status, "")
            table.add_row(
                node, step.phase, step.step, f"[{style}]{step.status}[/]",
                f"{step.seconds:.1f}s", step.message,
            )
    if table.row_count:
        console.print(table)
    if show_diffs:
        for node, host in report.hosts.items():
            for step in host.steps:
                if step.diff:
                    console.print(f"[bold]--- {node}: {step.phase}/{step.step}[/]")
                    console.print(step.diff, markup=False, highlight=False)
    summary = (
        f"{report.command}: {len(report.hosts)} node(s), {report.count('changed')} changed, "
        f"{report.failures} failed"
    )
    if report.count("planned"):
        summary += f", {report.count('planned')} would change"
    if quiet_ok:
        summary += f", {quiet_ok} already right (-v lists them)"
    summary += f" in {report.seconds:.1f}s"
    console.print(("[green]OK[/] " if report.ok else "[bold red]FAILED[/] ") + summary)
    for note in report.notes:
        console.print(note, markup=False, highlight=False)
