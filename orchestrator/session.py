"""A run against a cluster: connect to every node, hold the lock, execute a plan, report.

This is the thin middle between the CLI and the engine: commands build a plan (pure) and hand
it here.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from orchestrator.errors import LockError, SparkctlError
from orchestrator.executor import Executor, gather_facts
from orchestrator.inventory import Inventory, Node
from orchestrator.progress import Progress
from orchestrator.report import Report, StepResult
from orchestrator.step import Plan, RunOptions
from orchestrator.transport import SudoPassword, Transport

log = logging.getLogger("sparkctl.session")

LOCK_STALE_SECONDS = 2 * 3600


@dataclass
class Session:
    inventory: Inventory
    report: Report
    progress: Progress
    transports: dict[str, Transport] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    @property
    def unreachable(self) -> list[str]:
        return [name for name, host in self.report.hosts.items() if host.error]

    def reachable_nodes(self) -> list[Node]:
        return [n for n in self.inventory.nodes if n.name in self.transports]

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()

    def finish(self) -> Report:
        self.report.seconds = time.monotonic() - self.started
        return self.report


@contextmanager
def open_session(
    inventory: Inventory, command: str, *, trust_new_hosts: bool = False,
    nodes: list[Node] | None = None, quiet: bool = False, interactive: bool = True,
) -> Iterator[Session]:
    """Connect to the nodes (in parallel); an unreachable node is reported, not raised."""
    from orchestrator.connect import connect_all

    progress = Progress(quiet=quiet)
    report = Report(command=command)
    for node in nodes or inventory.nodes:
        report.host(node.name)
    session = Session(inventory, report, progress)
    sudo = SudoPassword(prompt=interactive and os.isatty(0))
    transports, errors = connect_all(inventory, nodes or inventory.nodes, sudo, trust_new_hosts)
    session.transports = transports
    for name, message in errors.items():
        report.fail_host(name, message)
        log.warning("connect %s: %s", name, message)
    try:
        yield session
    finally:
        session.close()


def run_plan(session: Session, plan: Plan, options: RunOptions) -> Report:
    executor = Executor(session.inventory, session.transports, options, session.report,
                        session.progress)
    executor.run(plan)
    return session.report


@contextmanager
def cluster_lock(session: Session, command: str, break_lock: bool = False) -> Iterator[None]:
    """Hold the cluster lock on the head for the duration of a mutating command."""
    head = session.inventory.head
    transport = session.transports.get(head.name)
    if transport is None:
        raise SparkctlError(f"cannot lock the cluster: the head {head.name} is unreachable")
    owner = {
        "token": uuid.uuid4().hex,
        "user": getpass.getuser(),
        "controller": socket.gethostname(),
        "pid": os.getpid(),
        "command": command,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    answer = _take_lock(transport, owner, break_lock)
    holder = answer.get("holder") or {}
    if not answer.get("held") and _holder_is_gone(holder):
        answer = _take_lock(transport, owner, True)
    if not answer.get("held"):
        holder = answer.get("holder") or {}
        raise LockError(
            f"the cluster is locked by another sparkctl run: {holder.get('command', '?')} by "
            f"{holder.get('user', '?')}@{holder.get('controller', '?')} (pid {holder.get('pid', '?')}), "
            f"since {holder.get('started', '?')}. Wait for it to finish; if that run is gone, "
            "run again with --break-lock"
        )
    try:
        yield
    finally:
        release = (
            "grep -q " + owner["token"] + " /var/lib/sparkctl/lock/owner 2>/dev/null && "
            "rm -rf /var/lib/sparkctl/lock || true"
        )
        try:
            transport.run(release, sudo=True, timeout=30)
        except SparkctlError as exc:
            log.warning("could not release the lock on %s: %s", head.name, exc)


def _take_lock(transport: Transport, owner: dict[str, object], force: bool) -> dict[str, object]:
    request = {"lock": {**owner, "break": force}, "lock_stale_seconds": LOCK_STALE_SECONDS}
    return gather_facts(transport, request).get("lock", {})


def _holder_is_gone(holder: dict[str, object]) -> bool:
    """A lock left by a run on this very controller whose process has died is stale."""
    if holder.get("controller") != socket.gethostname():
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def record_failure(report: Report, node: str, phase: str, step: str, message: str) -> None:
    report.add(node, StepResult(phase, step, "failed", message=message))
