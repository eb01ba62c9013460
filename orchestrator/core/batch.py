"""Consecutive steps of a phase whose changes are only commands, sent as one command per node.

A launch's serve phase drops the page cache, starts the memory guard, runs the server's
container and writes its record: four commands, each a round trip, with the lock-step wait for
every node after each. Steps that declare `batch` (core/step.py: their work is exactly their
commands on their own node, judged from the commands' results alone) are checked first, all of
them, as they would be one by one (checks are pure over the phase's facts); the commands of
those that change something go to the node's facts gatherer as one `batch`, which runs them in
order and answers each step's results on their own. Each step is then judged and reported as if
it had run alone: the run log lists every command under its step, a failure names its step and
command, and the steps after a failure do not run. When the run does not hold the cluster lock
yet and the head is the only node that changes something, the lock is taken by the same command,
before the batch runs (docs/architecture.md): a batch never runs without it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.commands import python_script_cmd
from orchestrator.core.report import StepResult
from orchestrator.core.step import Change, NotDone
from orchestrator.errors import SparkctlError
from orchestrator.remote.facts import gather_script
from orchestrator.remote.transport import Result

if TYPE_CHECKING:
    from orchestrator.core.step import NodeContext, Step

log = logging.getLogger("sparkctl.executor")  # the run log's lines of every step's commands


@dataclass
class Planned:
    """One step of a batch on one node: its check's Change and the commands it sends."""

    step: Step
    ctx: NodeContext
    change: Change
    commands: tuple[str, ...]


def groups(steps: list[Step]) -> list[list[Step]]:
    """The phase's steps in order, runs of consecutive batch steps together, others alone."""
    out: list[list[Step]] = []
    for step in steps:
        if step.batch and out and out[-1][0].batch:
            out[-1].append(step)
        else:
            out.append([step])
    return out


@dataclass
class Answer:
    """The gatherer's answer to a batch: the lock's (when asked) and each step's results."""

    lock: dict[str, Any] | None
    results: list[list[Result] | None] | None
    """Each planned step's results, in order (None: it did not run, a step before it failed);
    None when the batch did not run at all (the lock was not taken)."""


def run(phase: str, ctx: NodeContext, planned: list[Planned], lock: dict[str, Any] | None) -> Answer:
    """One round trip: LOCK (the lock's facts request, when this command takes it) then every
    planned step's commands, in order (each in the run log under its step, as it runs alone)."""
    node = ctx.node.name
    for p in planned:
        for command in p.commands:
            log.info("%s %s/%s runs: %s", node, phase, p.step.name, command)
    request: dict[str, Any] = {"batch": [
        {"step": p.step.name, "commands": list(p.commands), "keep_going": p.step.keep_going,
         "timeout": p.step.timeout} for p in planned]}
    request.update(lock or {})
    timeout = 60 + sum(p.step.timeout * len(p.commands) for p in planned)
    shown = ("take the cluster lock, then " if lock else "") + "batch: " + ", ".join(
        p.step.name for p in planned)
    result = ctx.run(python_script_cmd(request), stdin=gather_script(), sudo=True,
                     timeout=timeout, display=shown)
    try:
        answer = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise SparkctlError(
            f"{node}: the batch of {', '.join(p.step.name for p in planned)} answered no JSON "
            f"(exit {result.exit_status}): {result.stderr.strip()[-300:]!r}") from None
    steps = answer.get("batch")
    if not isinstance(steps, list) or len(steps) != len(planned):
        return Answer(answer.get("lock"), None)
    results = [[Result(node, command, int(r.get("rc", 1)), r.get("out", ""), r.get("err", ""),
                       float(r.get("seconds", 0.0)))
                for command, r in zip(p.commands, item.get("results") or [], strict=False)]
               if item.get("ran") else None
               for p, item in zip(planned, steps, strict=True)]
    return Answer(answer.get("lock"), results)


def check(phase: str, step: Step, ctx: NodeContext) -> Change | StepResult:
    """A step's check in a batch: its Change, or its result when nothing changes."""
    outcome = step.check(ctx)
    if isinstance(outcome, Change):
        return outcome
    return StepResult(phase, step.name, "ok", message=outcome.reason)


def done(phase: str, step: Step, ctx: NodeContext, change: Change,
         results: list[Result]) -> StepResult:
    """A batched step's result, judged by the step from its commands' results."""
    message = step.done(ctx, change, results)
    return StepResult(phase, step.name, "skipped" if isinstance(message, NotDone) else "changed",
                      message=message or change.summary, diff=change.diff,
                      commands=change.commands)
