"""Steps and phases: what a plan is made of.

A Step looks at the facts its phase gathered on a node and says what would change
(`check` -> Change) or why nothing needs to (`check` -> Unchanged). `apply` makes the change.
`check` is pure over the facts, so planning is unit-tested with faked facts and a no-change run
costs one round trip per phase per node. A verification step (kind "verify") only observes,
after the changes before it; it never counts as a change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.core.context import RunOptions as RunOptions  # (re-exported: steps' vocabulary)
from orchestrator.core.context import RunState as RunState
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.transport import Transport

Scope = Literal["node", "head"]
COMMAND_TIMEOUT = 600.0


@dataclass(frozen=True)
class Change:
    """What a step would do on a node."""

    summary: str
    diff: str = ""
    payload: Any = None
    commands: tuple[str, ...] = ()
    """The shell commands `apply` will run on the node, in order (pyinfra's idea): a dry run
    and the run log show exactly these. A step whose Change lists commands need not write an
    `apply`: the default runs them one by one and stops at the first that fails."""


@dataclass(frozen=True)
class Unchanged:
    """Already right, and why."""

    reason: str


Outcome = Change | Unchanged


class NotDone(str):
    """What a change step's apply returns when it could not do its work and the run may go on
    without it (a page cache that cannot be dropped): reported as skipped, never with the
    success tick of a change."""


class NotVerified(str):
    """What a verify step's apply returns when it had nothing to prove in this run ("not re-run:
    nothing changed"): reported as ok but, unlike a proof, not shown without -v."""


@dataclass
class NodeContext:
    """Everything a step sees for one node during one phase."""

    inventory: Inventory
    node: Node
    facts: NodeFacts
    """This node's facts of this phase, typed (remote/gathered.py)."""
    cluster_facts: dict[str, NodeFacts]
    """Every node's facts of this phase, by node name (for cluster-wide steps)."""
    transport: Transport | None
    options: RunOptions
    """What the command tells its steps (core/context.py)."""
    shared: RunState
    """Values steps hand to later steps in the same run (e.g. generated public keys), as the
    named fields of a RunState (core/context.py)."""
    transports: dict[str, Transport] = field(default_factory=dict)
    """Every reachable node's transport, for the few cluster-wide steps that write elsewhere."""

    @property
    def is_head(self) -> bool:
        return self.node.name == self.inventory.head_name

    def run(self, command: str, **kwargs: Any) -> Any:
        assert self.transport is not None, "apply() called without a transport"
        return self.transport.run(command, **kwargs)


class Step:
    """Base class: subclasses set `name`, and implement `check` and `apply`."""

    name = "step"
    kind: Literal["change", "verify"] = "change"
    scope: Scope = "node"

    def check(self, ctx: NodeContext) -> Outcome:
        raise NotImplementedError

    sudo = True
    """Whether the default `apply` runs the Change's commands as root."""

    batch = False
    """Its change is exactly `batch_commands`, run as root on its own node, judged by `done`
    from their results alone: the executor sends the commands of consecutive such steps of a
    phase as one command per node (core/batch.py), each step still reported on its own."""
    keep_going = False
    """In a batch, a failed command of this step ends only this step (`done` says what it
    means) and the batch goes on, as the run does after a step that returns NotDone."""
    timeout = COMMAND_TIMEOUT
    """Seconds each of its commands may take."""

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        """Make the change; return a message for the report (or None for the summary).

        The default runs `change.commands`; steps whose work is more than a list of commands
        (verification, streaming, several nodes) override it: the imperative escape hatch."""
        if not change.commands:
            raise NotImplementedError(f"{type(self).__name__} lists no commands and has no apply()")
        results = []
        for command in change.commands:
            results.append(ctx.run(command, sudo=self.sudo, timeout=self.timeout))
            if not results[-1].ok:
                break
        return self.done(ctx, change, results)

    def batch_commands(self, ctx: NodeContext, change: Change) -> tuple[str, ...] | None:
        """What this step runs on ctx's node in a batch (None: it runs its own `apply`)."""
        return change.commands if self.batch and self.sudo else None

    def done(self, ctx: NodeContext, change: Change, results: list[Any]) -> str | None:
        """The outcome of its commands' RESULTS (transport Results, in order; they stop at the
        first that failed): the first failure raises, naming the command; else None (the
        Change's summary is the message)."""
        for result in results:
            if not result.ok:
                why = (result.stderr or result.stdout or "").strip().splitlines()
                raise SparkctlError(f"{ctx.node.name}: `{result.command}` failed (exit {result.exit_status})"
                                    + (f": {why[-1]}" if why else ""))
        return None

    def interrupt_hint(self, inventory: Inventory) -> str | None:
        """What a Ctrl-C during this step leaves behind and what to do (None: just re-run)."""
        return None

    def runs_on(self, inventory: Inventory) -> str:
        """Where a step of scope "head" runs, once, and whose line it is in the report: the
        head, unless the step is about one server's node (its readiness, its smoke test: a
        server placed on spark-b is ready on spark-b). A node outside the phase: the head."""
        return inventory.head_name


FactsSpec = Callable[[Inventory, Node], dict[str, Any]]


@dataclass
class Phase:
    """Steps that run on every node (or the head) after every node finished the phase before."""

    name: str
    steps: list[Step]
    facts: FactsSpec
    """Builds the facts request for a node; the node-side gatherer answers it in one command."""
    head_only: bool = False
    stale_after: tuple[str, ...] | None = None
    """The earlier phases whose changes can touch what its facts ask (None: any phase's). A
    run gathers every phase's facts once, up front; after a change, a phase gathers its own
    again only when a phase named here changed something (docs/architecture.md)."""

    def nodes(self, inventory: Inventory) -> list[Node]:
        if self.head_only:
            return [inventory.head]
        return list(inventory.nodes)

    def runs(self, step: Step, node: Node, inventory: Inventory) -> bool:
        """Whether STEP runs on NODE: every node, or (scope "head") the one it runs on
        (Step.runs_on), the head when this phase does not cover that node."""
        if step.scope == "node":
            return True
        where = step.runs_on(inventory)
        members = {n.name for n in self.nodes(inventory)}
        return node.name == (where if where in members else inventory.head_name)


@dataclass
class Plan:
    command: str
    phases: list[Phase]
