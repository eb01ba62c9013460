"""A run's first round trip, started before the controller is ready for it.

A run that changes nothing (`up` again) waits on two things one after the other: the
controller getting ready (Python importing the plan's machinery and building the plan) and
the nodes answering that plan's facts request (the node-side gatherer). The request depends
only on the inventory and sparkctl's code, so the merged request each node got in the last
run of this command on this inventory is kept (state dir, `requests/`, 0600: paths and
commands, no secrets) and sent at once, over connections opened at once, while the
controller imports and builds its plan.

Nothing is taken on trust: the executor computes every node's request as always
(Executor._prefetch) and takes a node's early answer only when that request is the same, key
for key; otherwise (the inventory or sparkctl changed) the answer is dropped and the node is
asked again. The answers were gathered in this run, before anything changed, so every check
reads what it read before. Without a kept request (a first run) nothing starts early: the
session connects as always.

Only for an inventory the user named: an implicit one is named first
(runner.check_named_cluster), before anything connects.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.remote.gathered import NodeFacts
    from orchestrator.remote.transport import Transport

Request = dict[str, Any]


def _same(a: Request, b: Request) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def start_early(command: str, inventory: Inventory, inventory_path: Path, trust_new_hosts: bool,
                variant: str = "") -> Speculation | None:
    """A started Speculation for COMMAND (VARIANT: what else makes its requests, e.g. launch's
    recipe and options), or None for an inventory the user did not name."""
    from orchestrator.core.inventory_option import implicit_cluster

    if implicit_cluster(inventory) is not None:
        return None  # the cluster is named first, before anything connects
    speculation = Speculation(command, inventory, inventory_path, variant)
    speculation.start(trust_new_hosts)
    return speculation


class Speculation:
    """The early connections and the early answers of one run (used at most once)."""

    def __init__(self, command: str, inventory: Inventory, inventory_path: Path,
                 variant: str = "") -> None:
        from orchestrator import __version__
        from orchestrator.state import state_dir

        self.inventory = inventory
        digest = hashlib.sha256(
            "\0".join([command, variant, __version__, str(inventory_path.resolve())]).encode()
            + b"\0" + inventory_path.read_bytes()).hexdigest()[:24]
        self.path = state_dir() / "requests" / f"{command}-{digest}.json"
        self.kept: dict[str, Request] = self._read_kept()
        self._thread: threading.Thread | None = None
        self._connected = threading.Event()
        self._connections: tuple[dict[str, Transport], dict[str, str]] | None = None
        self._error: BaseException | None = None
        self._answers: dict[str, NodeFacts | str] = {}
        self._handed_over = False
        self.started = False
        """Whether the early connections (and requests) were started."""

    def _read_kept(self) -> dict[str, Request]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {name: request for name, request in data.items() if isinstance(request, dict)}

    def start(self, trust_new_hosts: bool) -> None:
        """Connect to every node and send each its kept request, in a thread. Only with a kept
        request: a first run (no request kept) connects as always, in the session."""
        if not self.kept:
            return
        # imported here, before the thread starts, so two threads never import one module
        import paramiko
        import paramiko.auth_strategy  # noqa: F401

        from orchestrator.remote.cluster import parallel
        from orchestrator.remote.connect import connect_all, sudo_password_files
        from orchestrator.remote.facts import gather_facts
        from orchestrator.remote.transport import SudoPassword

        # as the session makes it; a bad password file raises here, in the main thread
        sudo_password = SudoPassword(prompt=os.isatty(0),
                                     files=sudo_password_files(self.inventory))

        def run() -> None:
            try:
                self._connections = connect_all(self.inventory, self.inventory.nodes,
                                                sudo_password, trust_new_hosts)
            except BaseException as exc:  # bad input or a bug: raised in the main thread
                self._error = exc
                return
            finally:
                self._connected.set()
            transports = self._connections[0]
            asked = [name for name in self.kept if name in transports]
            outcomes = parallel(lambda name: gather_facts(transports[name], self.kept[name]), asked)
            for name, outcome in outcomes.items():
                if outcome.ok:
                    self._answers[name] = outcome.get()
                elif isinstance(outcome.error, SparkctlError):
                    self._answers[name] = str(outcome.error)  # what the executor would report
                # any other exception: no answer; the executor asks again and meets it itself

        self._thread = threading.Thread(target=run, name="sparkctl-speculate", daemon=True)
        self._thread.start()
        self.started = True

    def connections(self) -> tuple[dict[str, Transport], dict[str, str]]:
        """The early connections (transports, errors by node), handed to the session once."""
        self._connected.wait()
        if self._error is not None:
            raise self._error
        assert self._connections is not None
        self._handed_over = True
        return self._connections

    def answers(self, phase: Phase, nodes: list[Any]) -> dict[str, NodeFacts | str]:
        """The early answer of every node whose request (PHASE's) is the kept one; keeps the
        requests for the next run. Once: a later gathering asks the nodes again."""
        requests: dict[str, Request] = {}
        for node in nodes:
            with contextlib.suppress(SparkctlError):  # the executor meets it when it asks
                requests[node.name] = phase.facts(self.inventory, node)
        self._keep(requests)
        if self._thread is None:
            return {}
        self._thread.join()
        self._thread = None
        same = {name for name, request in requests.items()
                if name in self.kept and _same(request, self.kept[name])}
        return {name: answer for name, answer in self._answers.items() if name in same}

    def _keep(self, requests: dict[str, Request]) -> None:
        if not requests or (requests.keys() == self.kept.keys()
                            and all(_same(requests[n], self.kept[n]) for n in requests)):
            return
        with contextlib.suppress(OSError):  # only a missed head start next time
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.tmp")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(requests, handle, sort_keys=True)
            partial.replace(self.path)

    def close(self) -> None:
        """Close the early connections if no session took them (the run stopped before)."""
        if self._handed_over or not self._connected.is_set() or self._connections is None:
            return
        for transport in self._connections[0].values():
            transport.close()
