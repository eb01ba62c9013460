"""A run's first round trip, started before the controller is ready for it.

A run that changes nothing (`up` again, the same `launch` again) waits on two things one after
the other: the controller getting ready (Python importing the inventory's models and the plan's
machinery, building the plan) and the nodes answering that plan's facts request (the node-side
gatherer). The request depends only on the inventory and sparkctl's code, and how each node is
reached only on the inventory and the user's ssh_config, so the last run of this command on
this inventory file keeps both (state dir, `requests/`, 0600: each node's merged request and its
resolved route: host names, ports, users, paths and commands, no secret). The next run opens the
connections along the kept routes and sends the kept requests at once, before it has even loaded
the inventory, while the controller imports and builds its plan.

Nothing is taken on trust: once the inventory is loaded, every node's route is resolved as
always and the early connections are the session's only when the routes, the command timeout
and the sudo password files are the kept ones (else they are closed and the session connects as
always); host keys are verified on every early connection as on any other. The executor
computes every node's request as always (Executor._prefetch) and takes a node's early answer
only when that request is the same, key for key; otherwise (the inventory or sparkctl changed)
the answer is dropped and the node is asked again. The answers were gathered in this run, before
anything changed, so every check reads what it read before. Without a kept request (a first
run) nothing starts early: the session connects as always.

Only for an inventory the user named (--inventory, $SPARKCTL_INVENTORY): an implicit one is
named first (runner.check_named_cluster), before anything connects.
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

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.inventory import Inventory
    from orchestrator.remote.gathered import NodeFacts
    from orchestrator.remote.sshconfig import Route
    from orchestrator.remote.transport import Transport

Request = dict[str, Any]


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def start_early(command: str, inventory_option: str | None, trust_new_hosts: bool,
                variant: str = "") -> Speculation | None:
    """A Speculation for COMMAND (VARIANT: what else shapes its requests, e.g. launch's recipe
    and options), started at once when the last such run kept its requests; None when the user
    did not name the inventory (or it cannot be read: loading it says why)."""
    named = inventory_option or os.environ.get("SPARKCTL_INVENTORY")
    if not named:
        return None
    try:
        speculation = Speculation(command, Path(named), variant)
    except SparkctlError:  # (not a readable regular file: loading it says so)
        return None
    speculation.start(trust_new_hosts)
    return speculation


class Speculation:
    """The early connections and the early answers of one run (used at most once)."""

    def __init__(self, command: str, inventory_path: Path, variant: str = "") -> None:
        from orchestrator import __version__
        from orchestrator.state import state_dir
        from orchestrator.userfiles import read_user_file

        digest = hashlib.sha256(
            "\0".join([command, variant, __version__, str(inventory_path.resolve())]).encode()
            + b"\0" + read_user_file(inventory_path, "inventory")).hexdigest()[:24]
        self.path = state_dir() / "requests" / f"{command}-{digest}.json"
        self.kept: dict[str, Any] = self._read_kept()
        self.inventory: Inventory | None = None
        self._reach_now: dict[str, Any] | None = None
        self._thread: threading.Thread | None = None
        self._connected = threading.Event()
        self._connections: tuple[dict[str, Transport], dict[str, str]] | None = None
        self._error: BaseException | None = None
        self._answers: dict[str, NodeFacts | str] = {}
        self._handed_over = False
        self._closed = False
        self.started = False
        """Whether the early connections (and requests) were started and are the session's."""

    def _read_kept(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or not isinstance(data.get("requests"), dict) \
                or not isinstance(data.get("routes"), dict):
            return {}  # (also an older sparkctl's file: requests only)
        return data

    @property
    def requests(self) -> dict[str, Request]:
        return {name: request for name, request in self.kept.get("requests", {}).items()
                if isinstance(request, dict)}

    def _kept_reach_records(self) -> tuple[list[Route], float, dict[str, Path]] | None:
        """The kept routes, command timeout and sudo password files (None: none kept)."""
        from orchestrator.remote.sshconfig import Route

        try:
            routes = [Route.of_record(data) for data in self.kept["routes"].values()]
            return routes, float(self.kept["command_timeout"]), {
                str(name): Path(path) for name, path in self.kept["sudo_files"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def start(self, trust_new_hosts: bool) -> None:
        """Connect along the kept routes and send each node its kept request, in a thread.
        Only with kept requests: a first run connects as always, in the session."""
        reach = self._kept_reach_records() if self.requests else None
        if not reach or not reach[0]:
            return
        routes, timeout, sudo_files = reach
        from orchestrator.remote import keeper

        if len(keeper.held(routes)) < len(routes):
            # what the connections need, imported before the thread starts (never by two
            # threads at once); the facts module after (below), while the thread connects.
            # Routes the keeper holds need neither.
            import paramiko
            import paramiko.auth_strategy  # noqa: F401

        from orchestrator.remote.cluster import parallel
        from orchestrator.remote.connect import connect_routes
        from orchestrator.remote.transport import SudoPassword

        sudo_password = SudoPassword(prompt=os.isatty(0), files=sudo_files)

        def run() -> None:
            try:
                self._connections = connect_routes(routes, timeout, sudo_password,
                                                   trust_new_hosts)
            except BaseException as exc:  # bad input or a bug: raised in the main thread
                self._error = exc
                return
            finally:
                self._connected.set()
            if self._closed:  # the run ended (bad input) while connecting
                self._close_connections()
                return
            # (imported by the main thread just after this one started: waits until it is)
            from orchestrator.remote.facts import gather_facts

            transports = self._connections[0]
            asked = [name for name in self.requests if name in transports]
            outcomes = parallel(lambda name: gather_facts(transports[name], self.requests[name]),
                                asked)
            for name, outcome in outcomes.items():
                if outcome.ok:
                    self._answers[name] = outcome.get()
                elif isinstance(outcome.error, SparkctlError):
                    self._answers[name] = str(outcome.error)  # what the executor would report
                # any other exception: no answer; the executor asks again and meets it itself

        self._thread = threading.Thread(target=run, name="sparkctl-speculate", daemon=True)
        self._thread.start()
        self.started = True
        import orchestrator.remote.facts  # noqa: F401  (the thread's, once it is connected)

    def confirm(self, inventory: Inventory) -> None:
        """The inventory as loaded: the early connections stay only when every node is reached
        as the kept routes say (same routes, command timeout and sudo password files); else
        they are closed and the session connects as always."""
        self.inventory = inventory
        if self.started and self._reach() != self._kept_reach():
            self.started = False
            self._drop()

    def _reach(self) -> dict[str, Any]:
        """How the loaded inventory's nodes are reached, as kept: SSH routes (a local node has
        none), the command timeout and the sudo password files. Resolved once a run (confirm
        and _keep both read it; resolving reads the SSH config files)."""
        if self._reach_now is None:
            assert self.inventory is not None
            self._reach_now = self._resolve_reach(self.inventory)
        return self._reach_now

    @staticmethod
    def _resolve_reach(inventory: Inventory) -> dict[str, Any]:
        from orchestrator.remote.connect import is_local, sudo_password_files
        from orchestrator.remote.sshconfig import resolve

        routes = {}
        for node in inventory.nodes:
            route = resolve(inventory, node)
            if not is_local(route):
                routes[node.name] = route.record()
        return {"routes": routes, "command_timeout": inventory.cluster.command_timeout,
                "sudo_files": {name: str(path)
                               for name, path in sudo_password_files(inventory).items()}}

    def _kept_reach(self) -> dict[str, Any]:
        return {key: self.kept.get(key) for key in ("routes", "command_timeout", "sudo_files")}

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
        requests (and routes) for the next run. Once: a later gathering asks the nodes again."""
        assert self.inventory is not None, "confirm() the loaded inventory first"
        requests: dict[str, Request] = {}
        for node in nodes:
            with contextlib.suppress(SparkctlError):  # the executor meets it when it asks
                requests[node.name] = phase.facts(self.inventory, node)
        self._keep(requests)
        if self._thread is None or not self.started:
            return {}
        # the nodes are still answering: what the report prints with is imported meanwhile,
        # not after the answers (~15 ms of a no-change `up`'s critical path)
        import rich.console
        import rich.markup  # noqa: F401

        self._thread.join()
        self._thread = None
        kept = self.requests
        same = {name for name, request in requests.items()
                if name in kept and _same(request, kept[name])}
        return {name: answer for name, answer in self._answers.items() if name in same}

    def _keep(self, requests: dict[str, Request]) -> None:
        assert self.inventory is not None
        with contextlib.suppress(SparkctlError):  # (an unresolvable route: nothing kept)
            data = {"requests": requests, **self._reach()}
            if not requests or _same(data, self.kept):
                return
            with contextlib.suppress(OSError):  # only a missed head start next time
                self.path.parent.mkdir(parents=True, exist_ok=True)
                partial = self.path.with_suffix(f".{os.getpid()}.tmp")
                fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as handle:
                    json.dump(data, handle, sort_keys=True)
                partial.replace(self.path)

    def _drop(self) -> None:
        """Close what the thread opened (now or when it is done connecting)."""
        self._closed = True
        if self._connected.is_set():
            self._close_connections()

    def _close_connections(self) -> None:
        if self._connections is not None and not self._handed_over:
            for transport in self._connections[0].values():
                transport.close()

    def close(self) -> None:
        """Close the early connections if no session took them (the run stopped before)."""
        if not self._handed_over:
            self._drop()
