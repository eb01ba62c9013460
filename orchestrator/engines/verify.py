"""Readiness as verify steps, for any engine: wait until the server answers, then one real
request. The engine hands in how it waits and how it asks; these steps put the outcome in the
report (a failed wait leaves every node's log tail in the notes and the JSON `log_tails`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.core.progress import Heartbeat
from orchestrator.core.step import Change, NodeContext, Step
from orchestrator.engines.base import LaunchFailed, Ready
from orchestrator.errors import SparkctlError
from orchestrator.recipe import Note

if TYPE_CHECKING:
    from orchestrator.engines.readiness import Readiness, Target
    from orchestrator.inventory import Inventory
    from orchestrator.remote.transport import Transport

Wait = Callable[["dict[str, Transport]", float, Note], Ready]
Ask = Callable[["Transport"], str]
Mark = Callable[["dict[str, Transport]"], "str | None"]


class WaitReady(Step):
    name = "ready"
    kind = "verify"
    scope = "head"

    def __init__(self, wait: Wait, timeout: float, what: str, mark: Mark | None = None,
                 node: str | None = None) -> None:
        self.wait = wait
        self.timeout = timeout
        self.what = what
        self.mark = mark
        self.node = node
        """The server's first node, where it answers (None: the head)."""

    def runs_on(self, inventory: Inventory) -> str:
        return self.node or inventory.head_name

    def interrupt_hint(self, inventory: Inventory) -> str | None:
        return (f"Stopped waiting; {self.what} keeps loading on {self.runs_on(inventory)}. Follow "
                "it with `sparkctl logs --follow` or `sparkctl status`; stop it with `sparkctl down`")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        note: Note = ctx.options.note
        try:
            # an engine's own wait may say nothing while it loads weights: a line at least
            # every heartbeat, its own lines in between
            with Heartbeat(note, f"{self.what} on {ctx.node.name} to answer") as beat:
                ready = self.wait(ctx.transports, self.timeout, beat.say)
        except LaunchFailed as exc:
            # the head alone runs this step, so nothing else touches `shared` meanwhile
            ctx.shared.notes.append(exc.details)
            ctx.shared.report_extra["log_tails"] = exc.details
            raise SparkctlError(exc.reason) from None
        # the record says it was ready: a server that stops answering later is stalled, not
        # loading (engines/liveness.py)
        failed = self.mark(ctx.transports) if self.mark is not None and not ready.marked else None
        return (f"answering: {', '.join(ready.models)} ({ready.seconds:.1f}s)"
                + (f"; {failed}" if failed else ""))


def wait_step(target: Target, readiness: Readiness, timeout: float, what: str) -> WaitReady:
    """The one wait (engines/readiness.py) as the step every engine's launch ends with; once
    ready, the server's record says so (liveness.mark_ready)."""
    from orchestrator.engines.liveness import mark_ready
    from orchestrator.engines.readiness import wait_until_ready

    return WaitReady(lambda transports, seconds, note: wait_until_ready(
        transports, target, readiness, seconds, note), timeout, what,
        mark=lambda transports: mark_ready(transports[target.first], target.record),
        node=target.first)


class SmokeTest(Step):
    name = "smoke-test"
    kind = "verify"
    scope = "head"

    def __init__(self, ask: Ask) -> None:
        self.ask = ask

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        assert ctx.transport is not None
        return self.ask(ctx.transport)
