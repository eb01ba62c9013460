"""What every mutating command does around its plan: load, connect, lock, preview, confirm,
execute, report. Commands only build the plan.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.core.executor import Interrupted
from orchestrator.core.inventory_option import IMPLICIT as IMPLICIT
from orchestrator.core.inventory_option import implicit_cluster
from orchestrator.core.inventory_option import load_inventory_option as load_inventory_option
from orchestrator.core.lock import ClusterLock
from orchestrator.core.output import ask_yes_no, full_diff_requested, verbosity
from orchestrator.core.report import DiffMode, Report, print_json, render_report
from orchestrator.core.session import Session, open_session, run_plan
from orchestrator.core.step import Plan, RunOptions
from orchestrator.errors import EXIT_BAD_INPUT, InputError, SparkctlError
from orchestrator.inventory import Inventory

if TYPE_CHECKING:
    from orchestrator.core.speculate import Speculation

log = logging.getLogger("sparkctl.runner")


def check_named_cluster(request: RunRequest) -> None:
    """A mutating command must not act on a cluster the user never named without showing it,
    and never unattended: off a terminal, --yes needs --inventory or $SPARKCTL_INVENTORY."""
    which = implicit_cluster(request.inventory)
    if which is None or request.dry_run:
        return
    if request.yes and not sys.stdin.isatty():
        raise InputError(
            f"`sparkctl {request.command} --yes` was not told which cluster to act on: without "
            f"--inventory it would act on {which}. Name it: pass --inventory FILE or set "
            "SPARKCTL_INVENTORY=FILE", EXIT_BAD_INPUT)
    print(f"sparkctl {request.command}: acting on {which}", file=sys.stderr)


@dataclass
class RunRequest:
    command: str
    inventory: Inventory
    build: Callable[[Session], Plan]
    """Builds the plan once connected (some plans depend on what the nodes already run)."""
    dry_run: bool = False
    yes: bool = False
    as_json: bool = False
    trust_new_hosts: bool = False
    break_lock: bool = False
    lock: bool = True
    lock_optional: bool = False
    """Run without the lock when the head (where it lives) is unreachable, and say so (down)."""
    require_all_nodes: bool = True
    options: RunOptions = field(default_factory=RunOptions)
    """What the command tells its steps (the runner sets `command` and `dry_run`)."""
    after: Callable[[Session, Report], None] | None = None
    """Runs after a successful execution (e.g. launch's health wait), with the lock held."""
    speculation: Speculation | None = None
    """Connections (and facts) started while the command got ready (core/speculate.py)."""
    full_diff: bool = field(default_factory=full_diff_requested)
    """--diff: plans show every diff in full instead of a line per changed file."""

    @property
    def diffs(self) -> DiffMode:
        return "full" if self.full_diff else "summary"


def execute(request: RunRequest) -> int:
    """Run a plan on the cluster and print the report; returns the exit code."""
    from orchestrator.state import start_run_log

    check_named_cluster(request)
    run_log = start_run_log(request.command)
    speculation = request.speculation
    try:
        with open_session(request.inventory, request.command,
                          trust_new_hosts=request.trust_new_hosts, quiet=verbosity() < 0,
                          speculation=speculation) as session:
            return _execute(request, session, run_log)
    finally:
        if speculation is not None:
            speculation.close()


def _execute(request: RunRequest, session: Session, run_log: Path | None) -> int:
    """The plan of a connected session: build, preview or confirm, lock, run, report."""
    if session.unreachable and request.require_all_nodes:
        session.report.notes.append(
            "Nothing was changed: every node must be reachable for "
            f"`{request.command}` (unreachable: {', '.join(session.unreachable)})."
        )
        return _finish(request, session.finish(), run_log)
    if not session.transports:
        return _finish(request, session.finish(), run_log)
    try:
        plan = request.build(session)
    except SparkctlError as exc:
        diagnose_disks(session, exc)
        raise
    options = request.options
    options.command, options.dry_run = request.command, True
    if request.dry_run:
        run_plan(session, plan, options, speculation=request.speculation)
        return _finish(request, session.finish(), run_log, diffs=request.diffs)
    if not request.yes:
        _confirm_interactively(request, session, plan, options)
    options.dry_run = False
    if request.lock and request.lock_optional and request.inventory.head_name not in session.transports:
        request.lock = False
        session.report.notes.append(
            f"The head {request.inventory.head_name} is unreachable: ran without the cluster lock."
        )
    lock = None
    if request.lock:
        head = request.inventory.head_name
        if head not in session.transports:
            raise SparkctlError(f"cannot lock the cluster: the head {head} is unreachable")
        lock = ClusterLock(head, session.transports[head], request.command, request.break_lock)
    try:
        run_plan(session, plan, options, lock, speculation=request.speculation)
        if request.after and session.report.ok:
            if lock is not None:
                lock.ensure()  # what runs after may change things (the gateway follows)
            request.after(session, session.report)
    except Interrupted:
        _finish(request, session.finish(), run_log)
        raise
    finally:
        if lock is not None:
            lock.release()
    return _finish(request, session.finish(), run_log)


def diagnose_disks(session: Session, failure: SparkctlError) -> None:
    """A command that failed before its plan ran (e.g. a `docker exec` finding no container):
    when a node's disk is full or read-only, that is the cause to name (node, path, free)."""
    from orchestrator.core.disks import space_problems
    from orchestrator.remote.facts import gather_facts

    problems: list[str] = []
    for name, transport in session.transports.items():
        try:
            problems += [f"{name}: {p}" for p in space_problems(gather_facts(transport, {}, 30))]
        except SparkctlError:
            continue
    if problems:
        raise SparkctlError("; ".join(problems) + f". Free some space on the node and run the "
                            f"command again (it failed with: {failure})") from None


def _confirm_interactively(request: RunRequest, session: Session, plan: Plan,
                           options: RunOptions) -> None:
    if not sys.stdin.isatty():
        raise InputError(
            f"`{request.command}` changes the cluster and stdin is not a terminal: "
            "pass --yes to apply, or --dry-run to only see the plan", EXIT_BAD_INPUT
        )
    preview = Report(command=f"{request.command} (plan)")
    preview_session = Session(session.inventory, preview, session.progress, session.transports)
    for name in session.report.hosts:
        preview.host(name)
    run_plan(preview_session, plan, options, speculation=request.speculation)
    render_report(preview, diffs=request.diffs)
    if not preview.ok:
        raise InputError("the plan itself failed (see above); nothing was changed", 1)
    if preview.count("planned") == 0:
        print("Nothing to change.", file=sys.stderr)
    elif not ask_yes_no(f"Apply these changes to cluster {request.inventory.cluster.name} "
                        f"(head {request.inventory.head_name}, inventory "
                        f"{request.inventory.source})?"):
        raise InputError("cancelled; nothing was changed", 1)
    # the preview ran on its own report; only steps are dropped: a node that could not be
    # reached stays failed (issue #12: a prompt-confirmed `down` showed it ok and exited 0)
    for host in session.report.hosts.values():
        host.steps = []


def _finish(request: RunRequest, report: Report, run_log: Path | None,
            diffs: DiffMode = "none") -> int:
    if run_log is not None:
        report.extra.setdefault("log", str(run_log))
    log.info("report: %s", report.to_json())
    if request.as_json:
        print_json(report.to_json())
    else:
        render_report(report, diffs=diffs, verbose=verbosity() > 0)
        if run_log is not None and not report.ok:
            print(f"Run log: {run_log}", file=sys.stderr)
    return report.exit_code
