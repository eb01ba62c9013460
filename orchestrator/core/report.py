"""The outcome of a run: per host, per step; rendered as a table, as JSON, as an exit code."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from orchestrator.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK

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
    proof: bool = False
    """A verify step that checked something (mpirun reached every node, the network was
    confirmed): shown without -v. Not part of the JSON."""

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
    refused: bool = False
    """A step refused the input (its SparkctlError carried exit 2): the run exits 2, not 1."""

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
        if self.ok:
            return EXIT_OK
        return EXIT_BAD_INPUT if self.refused else EXIT_FAILED

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


DiffMode = Literal["none", "summary", "full"]
"""How a report shows the diffs of its steps: not at all, a line per file (plans), or in full
(--diff)."""


def shown_steps(report: Report, verbose: bool) -> tuple[list[tuple[str, StepResult]], int]:
    """(node, step) rows worth a line, and how many fine rows were left out (-v lists them):
    with several nodes, steps that were already right are left out, except proofs (a verify step
    that checked something) and messages saying something of the user's was left alone."""
    rows: list[tuple[str, StepResult]] = []
    quiet = 0
    for node, host in report.hosts.items():
        for step in host.steps:
            if (step.status in ("ok", "skipped") and not verbose and len(report.hosts) > 1
                    and not step.proof and not worth_showing(step.message)):
                quiet += 1
                continue
            rows.append((node, step))
    return rows, quiet


def summary_line(report: Report, quiet_ok: int) -> str:
    summary = (
        f"{report.command}: {len(report.hosts)} node(s), {report.count('changed')} changed, "
        f"{report.failures} failed"
    )
    if report.count("planned"):
        summary += f", {report.count('planned')} would change"
    if quiet_ok:
        summary += f", {quiet_ok} already right (-v lists them)"
    return summary + f" in {report.seconds:.1f}s"


def command_lines(report: Report) -> list[str]:
    """`spark-a, spark-b serve/drop-caches: COMMAND` per command of the steps that list theirs
    (Change.commands), identical ones across nodes once, in the order they run."""
    nodes_of: dict[tuple[str, str], list[str]] = {}
    for node, host in report.hosts.items():
        for step in host.steps:
            for command in step.commands:
                nodes_of.setdefault((f"{step.phase}/{step.step}", command), []).append(node)
    return [f"{', '.join(nodes)} {where}: {command}" for (where, command), nodes in nodes_of.items()]


def render_report(report: Report, diffs: DiffMode = "none", verbose: bool = False) -> None:
    """Print the report for people (the rule for terminals and pipes: core/output.py).

    On a terminal: a table of the steps that did something (all with -v), the diffs, the
    summary line, the notes. Off a terminal the progress stream on stderr already listed every
    step that changed, failed or proved something, so stdout gets no table: each failure in
    full, the diffs, the summary line and the notes."""
    from rich.markup import escape

    from orchestrator.core import diffs as diff_text
    from orchestrator.core.output import console, on_terminal

    out = console()
    rows, quiet_ok = shown_steps(report, verbose)
    if on_terminal():
        from rich.table import Table

        table = Table(title=f"sparkctl {report.command}", show_lines=False, expand=False)
        for column in ("node", "phase", "step", "status", "time", "message"):
            table.add_column(column, overflow="fold")
        for node, host in report.hosts.items():
            if host.error:
                table.add_row(node, "-", "connect", "[bold red]failed[/]", "", escape(host.error))
        for node, step in rows:
            style = STATUS_STYLE.get(step.status, "")
            table.add_row(node, step.phase, step.step, f"[{style}]{step.status}[/]",
                          f"{step.seconds:.1f}s", escape(step.message))
        if table.row_count:
            out.print(table)
    else:
        for node, host in report.hosts.items():
            if host.error:
                out.print(f"failed {node} connect: {host.error}", markup=False)
        for node, step in rows:
            # -v: every row, also those the stream left out (the summary's "-v lists them")
            if step.status == "failed" or verbose:
                out.print(f"{step.status} {node} {step.phase}/{step.step}: {step.message}",
                          markup=False)
    if diffs != "none":
        found = diff_text.step_diffs(
            (node, [(f"{s.phase}/{s.step}", s.diff) for s in host.steps])
            for node, host in report.hosts.items())
        if found and diffs == "summary":
            out.print("changes per file (--diff shows the full diffs):", markup=False)
            for line in diff_text.summary_lines(found):
                out.print(f"  {line}", markup=False)
        for header, text in diff_text.full_text(found) if diffs == "full" else []:
            out.print(f"=== {header}", markup=False)
            out.print(text.rstrip("\n"), markup=False)
    if diffs == "full":
        listed = command_lines(report)
        if listed:
            out.print("commands (each step's, on the nodes named):", markup=False)
            for line in listed:
                out.print(f"  {line}", markup=False)
    summary = summary_line(report, quiet_ok)
    out.print(("[green]OK[/] " if report.ok else "[bold red]FAILED[/] ") + escape(summary))
    for note in report.notes:
        out.print(note, markup=False)
