"""A run against a cluster: connect to every node, hold the lock, execute a plan, report.

This is the thin middle between the CLI and the engine: commands build a plan (pure) and hand
it here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.core.executor import Executor
from orchestrator.core.progress import Progress
from orchestrator.core.report import Report
from orchestrator.core.step import Plan, RunOptions
from orchestrator.inventory import Inventory, Node
from orchestrator.remote.transport import SudoPassword, Transport

if TYPE_CHECKING:
    from orchestrator.core.lock import ClusterLock
    from orchestrator.core.speculate import Speculation

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
    speculation: Speculation | None = None,
) -> Iterator[Session]:
    """Connect to the nodes (in parallel); an unreachable node is reported, not raised.
    With a started SPECULATION (every node, opened while the command was getting ready),
    its connections are the session's."""
    from orchestrator.remote.connect import connect_all, sudo_password_files

    progress = Progress(quiet=quiet)
    report = Report(command=command)
    for node in nodes or inventory.nodes:
        report.host(node.name)
    session = Session(inventory, report, progress)
    if speculation is not None and speculation.started and nodes is None:
        transports, errors = speculation.connections()
    else:
        sudo = SudoPassword(prompt=interactive and os.isatty(0),
                            files=sudo_password_files(inventory))
        transports, errors = connect_all(inventory, nodes or inventory.nodes, sudo, trust_new_hosts)
    session.transports = transports
    for name, message in errors.items():
        report.fail_host(name, message)
        log.warning("connect %s: %s", name, message)
    try:
        yield session
    finally:
        session.close()


def run_plan(session: Session, plan: Plan, options: RunOptions,
             lock: ClusterLock | None = None, speculation: Speculation | None = None) -> Report:
    executor = Executor(session.inventory, session.transports, options, session.report,
                        session.progress, lock=lock, speculation=speculation)
    executor.run(plan)
    return session.report
