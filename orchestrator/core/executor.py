"""Running a plan: phases in lock-step across nodes, each node in parallel.

For each phase: gather facts on every node (one remote command each), then run the steps in
lock-step too (step k on every node before step k+1), so a cluster-wide step sees what the
steps before it produced on every node. A failed node stops its own remaining steps; the run
stops after the phase, and the report still holds every node's outcome.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from orchestrator.core import batch
from orchestrator.errors import EXIT_BAD_INPUT, SparkctlError
from orchestrator.remote.cluster import executor_pool
from orchestrator.remote.facts import gather_facts, merge_requests
from orchestrator.remote.gathered import NodeFacts

if TYPE_CHECKING:
    from orchestrator.core.lock import ClusterLock
    from orchestrator.core.speculate import Speculation
from orchestrator.core.progress import Heartbeat, Progress
from orchestrator.core.report import Report, StepResult
from orchestrator.core.step import (
    Change,
    NodeContext,
    NotDone,
    NotVerified,
    Phase,
    Plan,
    RunOptions,
    RunState,
    Step,
)
from orchestrator.inventory import Inventory, Node
from orchestrator.remote.transport import Transport

log = logging.getLogger("sparkctl.executor")


class Interrupted(SparkctlError):
    exit_code = 130


class Executor:
    def __init__(
        self, inventory: Inventory, transports: dict[str, Transport], options: RunOptions,
        report: Report, progress: Progress, lock: ClusterLock | None = None,
        speculation: Speculation | None = None,
    ) -> None:
        self.lock = lock
        self.speculation = speculation
        self.inventory = inventory
        self.transports = transports
        self.options = options
        self.report = report
        self.progress = progress
        self.shared = RunState()
        self._shared_lock = threading.Lock()
        self.failed: set[str] = {name for name, host in report.hosts.items() if host.error}
        self.pool = executor_pool(len(inventory.nodes))
        # (phase, step, nodes) running now: what an interrupt may have left half-done
        self.current: tuple[str, str, list[str]] | None = None
        self.current_hint: str | None = None
        self.prefetched: dict[str, NodeFacts] | None = None
        self._lock_guard = threading.Lock()
        self._lock_error: SparkctlError | None = None
        self.phase_names: set[str] = set()

    def run(self, plan: Plan) -> Report:
        self.phase_names = {phase.name for phase in plan.phases}
        try:
            self.prefetched = self._prefetch(plan)
            if self.lock is not None and self.prefetched is None:
                self.lock.ensure()  # a one-phase plan: taken at once, as before
            for index, phase in enumerate(plan.phases):
                self._run_phase(phase)
                if self.failed:
                    later = [p.name for p in plan.phases[index + 1:]]
                    if later:
                        self.report.notes.append(
                            f"Stopped after phase '{phase.name}' because "
                            f"{', '.join(sorted(self.failed))} failed; not run: {', '.join(later)}."
                        )
                    break
        except KeyboardInterrupt:
            self.pool.shutdown(wait=False, cancel_futures=True)
            summary = self.interrupted_summary()
            self.report.notes.append("Interrupted: " + summary)
            raise Interrupted("interrupted by the user; " + summary) from None
        finally:
            self.pool.shutdown(wait=False)
            # long explanations steps leave for the end (e.g. every node's log tail), and the
            # fields they add to the JSON report
            self.report.notes.extend(self.shared.notes)
            self.report.extra.update(self.shared.report_extra)
        return self.report

    def changes_summary(self) -> str:
        changed = [
            f"{node}: {s.phase}/{s.step}"
            for node, host in self.report.hosts.items()
            for s in host.steps
            if s.status == "changed"
        ]
        return "changes made: " + ("; ".join(changed) if changed else "none")

    def interrupted_summary(self) -> str:
        """What an interrupted run did, and what it was doing (that may have completed)."""
        text = self.changes_summary()
        if self.current:
            phase, step, nodes = self.current
            text += (f"; interrupted during {phase}/{step} on {', '.join(nodes)} "
                     "(that step may have completed on those nodes)")
        if self.current_hint:  # the step knows best what an interrupt leaves behind
            return f"{text}. {self.current_hint}"
        return text + ". Run the command again: it converges from wherever this stopped"

    def _run_phase(self, phase: Phase) -> None:
        nodes = [
            n for n in phase.nodes(self.inventory)
            if n.name in self.transports and n.name not in self.failed
        ]
        if not nodes:
            return
        self.progress.phase(phase.name, len(nodes))
        self.current = (phase.name, "facts", [n.name for n in nodes])
        if self.prefetched is not None and self._facts_still_valid(phase.stale_after):
            facts = {n.name: self.prefetched[n.name] for n in nodes if n.name in self.prefetched}
        else:
            facts = self._gather(phase, nodes)
        nodes = [n for n in nodes if n.name in facts]
        for group in batch.groups(phase.steps):
            if len(group) > 1 and not self.options.dry_run:
                self._run_batch(phase, group, nodes, facts)
                continue
            step = group[0]
            targets = [n for n in nodes if n.name not in self.failed
                       and phase.runs(step, n, self.inventory)]
            self.current = (phase.name, step.name, [n.name for n in targets])
            self.current_hint = step.interrupt_hint(self.inventory)
            futures = [self.pool.submit(self._run_step, phase, step, n, facts) for n in targets]
            for future in futures:
                future.result()

    def _prefetch(self, plan: Plan) -> dict[str, NodeFacts] | None:
        """Gather every phase's facts in one round trip per node, up front.

        They stay valid until something changes: a no-change run and any dry run then cost one
        round trip per node in all, instead of one per phase. After the first change, each later
        phase gathers its own fresh facts again, unless it names the phases whose changes can
        touch its facts (Phase.stale_after) and none of them changed anything.
        """
        if len(plan.phases) < 2:
            return None
        requests: dict[str, list[dict[str, Any]]] = {}
        for phase in plan.phases:
            for node in phase.nodes(self.inventory):
                if node.name in self.transports and node.name not in self.failed:
                    requests.setdefault(node.name, []).append(phase.facts(self.inventory, node))
        head = self.inventory.head_name
        if self.lock is not None and head in requests:
            # only a look: the lock is taken before the first change (_ensure_lock), so a run
            # that changes nothing costs no lock and no release round trip
            requests[head].append(self.lock.peek_request())
        merged = Phase("facts", [], lambda inventory, node: merge_requests(requests[node.name]))
        nodes = [n for n in self.inventory.nodes if n.name in requests]
        self.progress.phase("facts", len(nodes))
        # answers gathered while the controller got ready, for requests exactly these
        early = self.speculation.answers(merged, nodes) if self.speculation is not None else {}
        facts = self._gather(merged, nodes, early)
        if self.lock is not None and head in facts:
            self.lock.judge_peek(facts[head].lock or {})
        return facts

    def _ensure_lock(self) -> None:
        """Take the cluster lock before the first change (once; a failure stays for every
        step that would change something, so none does)."""
        if self.lock is None:
            return
        with self._lock_guard:
            if self._lock_error is not None:
                raise self._lock_error
            try:
                self.lock.ensure()
            except SparkctlError as exc:
                self._lock_error = exc
                raise

    def _refuse_full_disks(self, facts: dict[str, NodeFacts]) -> None:
        """Before anything changes: a node whose disk is full (or read-only) where sparkctl
        writes would fail half-way with a confusing error. `down` still runs: it frees space.
        Plans with a preflight phase (up) get it there, as a failed check in the report."""
        from orchestrator.core.disks import space_problems

        if self.options.command == "down" or "preflight" in self.phase_names:
            return  # down frees space; a preflight phase reports it as its own failed check
        problems = [f"{name}: {problem}" for name, node_facts in sorted(facts.items())
                    for problem in space_problems(node_facts)]
        if problems:
            done = self.changes_summary() if not self._facts_still_valid() else "nothing was changed"
            raise SparkctlError("; ".join(problems) + ". Free some space on the node (or remount "
                                f"it read-write) and run the command again; {done}")

    def _facts_still_valid(self, stale_after: tuple[str, ...] | None = None) -> bool:
        """No change since the facts were gathered up front (STALE_AFTER: by those phases)."""
        return self.options.dry_run or not any(
            s.status == "changed" and (stale_after is None or s.phase in stale_after)
            for host in self.report.hosts.values() for s in host.steps
        )

    def _gather(self, phase: Phase, nodes: list[Node],
                early: dict[str, NodeFacts | str] | None = None) -> dict[str, NodeFacts]:
        pending = {node.name for node in nodes}

        def one(node: Node) -> tuple[str, NodeFacts | str]:
            if early and node.name in early:
                pending.discard(node.name)
                return node.name, early[node.name]
            try:
                request = phase.facts(self.inventory, node)
                return node.name, gather_facts(self.transports[node.name], request)
            except SparkctlError as exc:
                return node.name, str(exc)
            finally:
                pending.discard(node.name)

        facts: dict[str, NodeFacts] = {}
        # a first look at a model hashes every file (minutes for 100 GB): never a silent wait
        with Heartbeat(self.progress.note, f"facts ({phase.name})",
                       detail=lambda: "from " + ", ".join(sorted(pending))):
            answers = list(self.pool.map(one, nodes))
        for name, value in answers:
            if isinstance(value, str):
                self._fail(name, StepResult(phase.name, "facts", "failed", 0.0, value))
            else:
                facts[name] = value
        self._refuse_full_disks(facts)
        return facts

    def _context(self, node: Node, facts: dict[str, NodeFacts]) -> NodeContext:
        return NodeContext(inventory=self.inventory, node=node, facts=facts[node.name],
                           cluster_facts=facts, transport=self.transports[node.name],
                           options=self.options, shared=self.shared, transports=self.transports)

    def _run_step(self, phase: Phase, step: Step, node: Node, facts: dict[str, NodeFacts]) -> None:
        ctx = self._context(node, facts)
        started = time.monotonic()
        result = self._guarded(phase, step, node, lambda: self._check_and_apply(phase, step, ctx))
        result.seconds = time.monotonic() - started
        self._record(node, result)

    def _guarded(self, phase: Phase, step: Step, node: Node, work: Callable[[], Any]) -> Any:
        """WORK's result, or the failure it raised as a failed result (never a traceback)."""
        try:
            return work()
        except SparkctlError as exc:
            if exc.exit_code == EXIT_BAD_INPUT:  # e.g. Ray forced on an image without it
                self.report.refused = True
            return StepResult(phase.name, step.name, "failed", message=str(exc))
        except Exception as exc:  # a bug must still leave a full report behind
            log.error("internal error in %s/%s on %s:\n%s", phase.name, step.name, node.name,
                      traceback.format_exc())
            return StepResult(
                phase.name, step.name, "failed",
                message=f"internal error: {type(exc).__name__}: {exc} (details in the run log)",
            )

    def _record(self, node: Node, result: StepResult) -> None:
        if result.status == "failed":
            self._fail(node.name, result)
        else:
            self.report.add(node.name, result)
        if result.status == "changed":
            # later verification steps (mpirun) re-run only when something changed
            with self._shared_lock:
                self.shared.changed_steps.append(f"{node.name}: {result.phase}/{result.step}")
        self.progress.step(node.name, result)

    def _check_and_apply(self, phase: Phase, step: Step, ctx: NodeContext) -> StepResult:
        if step.kind == "verify":
            if self.options.dry_run:
                return StepResult(phase.name, step.name, "skipped", message="verified after changes")
            message = step.apply(ctx, Change("verify"))
            return StepResult(phase.name, step.name, "ok", message=message or "verified",
                              proof=not isinstance(message, NotVerified))
        outcome = step.check(ctx)
        if not isinstance(outcome, Change):
            return StepResult(phase.name, step.name, "ok", message=outcome.reason)
        if self.options.dry_run:
            return StepResult(phase.name, step.name, "planned", message=outcome.summary,
                              diff=outcome.diff, commands=outcome.commands)
        self._ensure_lock()
        for command in outcome.commands:
            log.info("%s %s/%s runs: %s", ctx.node.name, phase.name, step.name, command)
        message = step.apply(ctx, outcome)
        return StepResult(phase.name, step.name,
                          "skipped" if isinstance(message, NotDone) else "changed",
                          message=message or outcome.summary, diff=outcome.diff,
                          commands=outcome.commands)

    def _run_batch(self, phase: Phase, group: list[Step], nodes: list[Node],
                   facts: dict[str, NodeFacts]) -> None:
        """GROUP's steps (core/batch.py): every node's checks first, the lock, then each node's
        changes in one command, each step judged and reported as if it ran alone."""
        plans: list[tuple[Node, list[tuple[Step, NodeContext, Any]]]] = []
        for node in (n for n in nodes if n.name not in self.failed):
            plans.append((node, plan := []))
            ctx = self._context(node, facts)
            for step in (s for s in group if phase.runs(s, node, self.inventory)):
                plan.append((step, ctx, self._guarded(phase, step, node, partial(
                    batch.check, phase.name, step, ctx))))
                if isinstance(plan[-1][2], StepResult) and plan[-1][2].status == "failed":
                    break  # its check failed: the steps after it do not run
        changing = {node.name for node, plan in plans
                    if any(isinstance(outcome, Change) for _, _, outcome in plan)}
        head = self.inventory.head_name  # the lock rides along when no other node's change races
        fold = self.lock is not None and not self.lock.held and changing == {head}
        self.current = (phase.name, ", ".join(s.name for s in group), [n.name for n, _ in plans])
        self.current_hint = next((hint for s in group
                                  if (hint := s.interrupt_hint(self.inventory))), None)
        for future in [self.pool.submit(self._apply_batch, phase, node, plan,
                                        fold and node.name == head) for node, plan in plans]:
            future.result()

    def _apply_batch(self, phase: Phase, node: Node,
                     plan: list[tuple[Step, NodeContext, Any]], fold: bool) -> None:
        planned = [batch.Planned(step, ctx, outcome, commands)
                   for step, ctx, outcome in plan if isinstance(outcome, Change)
                   for commands in [step.batch_commands(ctx, outcome)] if commands]
        changes = sum(isinstance(outcome, Change) for _, _, outcome in plan)
        sent = planned and len(planned) == changes and (len(planned) > 1 or fold)
        answer: list[Any] | StepResult | None = None
        for step, ctx, outcome in plan:
            if node.name in self.failed:
                return
            if not isinstance(outcome, Change):
                self._record(node, outcome)  # already right, or its check failed
                continue
            if not sent:  # not batched on this node: the step alone, as ever
                self._run_step(phase, step, node, ctx.cluster_facts)
                continue
            started = time.monotonic()
            if answer is None:  # at the first change: one round trip for them all
                answer = self._send_batch(phase, node, planned, fold)
            if isinstance(answer, StepResult):  # nothing ran (the lock, the connection)
                answer.seconds = time.monotonic() - started
                self._record(node, answer)
                return
            results = answer[[p.step for p in planned].index(step)]
            if results is None:
                return
            result = self._guarded(phase, step, node, partial(
                batch.done, phase.name, step, ctx, outcome, results))
            result.seconds = sum(r.seconds for r in results)
            self._record(node, result)

    def _send_batch(self, phase: Phase, node: Node, planned: list[batch.Planned],
                    fold: bool) -> list[Any] | StepResult:
        """One round trip for PLANNED (FOLD: the lock taken first, by the same command)."""
        first = planned[0]
        try:
            if not fold:
                self._ensure_lock()
            answer = (self._batch_with_lock(phase.name, planned) if fold
                      else batch.run(phase.name, first.ctx, planned, None))
        except SparkctlError as exc:
            return StepResult(phase.name, first.step.name, "failed", message=str(exc))
        if answer.results is None:
            return StepResult(phase.name, first.step.name, "failed",
                              message=f"{node.name}: the batch did not run")
        return answer.results

    def _batch_with_lock(self, phase: str, planned: list[batch.Planned]) -> batch.Answer:
        """The batch, the lock taken first by the same command (_ensure_lock's rules)."""
        assert self.lock is not None
        with self._lock_guard:
            if self._lock_error is not None:
                raise self._lock_error
            try:
                answer = batch.run(phase, planned[0].ctx, planned, self.lock.request())
                self.lock.accept(answer.lock or {})
            except SparkctlError as exc:
                self._lock_error = exc
                raise
        if answer.results is None:  # accept() took over a dead run's lock itself: run it now
            answer = batch.run(phase, planned[0].ctx, planned, None)
        return answer

    def _fail(self, node: str, result: StepResult) -> None:
        self.failed.add(node)
        self.report.add(node, result)
