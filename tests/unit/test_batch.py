"""Issue 40: consecutive `batch` steps of a phase run as one command per node (core/batch.py),
through the real node-side gatherer (run here), each step judged and reported on its own; the
cluster lock is taken by the same command when the head alone changes something."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import facts_request
from test_node_gather import gather

from orchestrator.core.executor import Executor
from orchestrator.core.lock import ClusterLock
from orchestrator.core.progress import Progress
from orchestrator.core.report import Report
from orchestrator.core.step import (
    Change,
    NodeContext,
    NotDone,
    Outcome,
    Phase,
    Plan,
    RunOptions,
    Step,
    Unchanged,
)
from orchestrator.inventory_checks import inventory_from_data

INVENTORY = inventory_from_data(
    {"cluster": {"name": "c", "ssh_key": "/k"},
     "nodes": [{"name": "spark-a", "host": "a"}, {"name": "spark-b", "host": "b"}]}, "inv.yml")


class Touch(Step):
    """A batch step: its one command touches MARK (a failing COMMAND instead, when given)."""

    batch = True

    def __init__(self, name: str, mark: Path, command: str | None = None) -> None:
        self.name, self.mark, self.command = name, mark, command

    def check(self, ctx: NodeContext) -> Outcome:
        if self.mark.with_suffix("." + ctx.node.name).exists():
            return Unchanged("there")
        return Change(f"make {self.name}",
                      commands=(self.command or f"touch {self.mark.with_suffix('.' + ctx.node.name)}",))


class Warns(Touch):
    """A failure that is only a warning (as DropCaches' read-only /proc/sys)."""

    keep_going = True

    def done(self, ctx: NodeContext, change: Change, results: list[Any]) -> str | None:
        return None if results[-1].ok else NotDone(f"skipped: {results[-1].stderr.strip()}")


class Look(Step):
    name = "look"

    def check(self, ctx: NodeContext) -> Outcome:
        return Unchanged("nothing to do")


@pytest.fixture
def launch(fake_transport: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Runs PHASE after a no-change phase (so the facts come up front and the lock lazily) on
    NODES, whose gatherer is the real one (its lock under tmp_path/state)."""
    def go(steps: list[Step], nodes: tuple[str, ...] = ("spark-a",),
           before_batch: Any = None) -> tuple[Report, dict[str, Any]]:
        one_at_a_time = threading.Lock()  # the gatherer runs in this process (its stdout)

        def answer(request: dict[str, Any]) -> dict[str, Any]:
            with one_at_a_time:
                if request.get("batch") and before_batch is not None:
                    before_batch()
                return gather(request, tmp_path, monkeypatch)
        transports = {n: fake_transport(n, facts=answer) for n in nodes}
        report = Report("launch")
        for n in nodes:
            report.host(n)
        lock = ClusterLock("spark-a", transports["spark-a"], "launch")
        plan = Plan("launch", [Phase("check", [Look()], lambda inv, node: {}),
                               Phase("serve", steps, lambda inv, node: {})])
        Executor(INVENTORY, transports, RunOptions(), report, Progress(quiet=True), lock).run(plan)
        return report, transports
    return go


def requests(transport: Any) -> list[dict[str, Any]]:
    return [r for r in (facts_request(c) for c in transport.commands) if r is not None]


def test_the_steps_changes_are_one_command_with_the_lock_taken_in_it(
        launch: Any, tmp_path: Path) -> None:
    report, transports = launch([Touch("one", tmp_path / "one"), Touch("two", tmp_path / "two")])
    sent = requests(transports["spark-a"])
    assert len(transports["spark-a"].commands) == 2  # the facts (a look at the lock), the batch
    assert sent[0].get("lock_peek") and "lock" in sent[1]
    assert [item["step"] for item in sent[1]["batch"]] == ["one", "two"]
    steps = {s.step: s for s in report.hosts["spark-a"].steps}
    assert steps["one"].status == steps["two"].status == "changed"
    assert steps["two"].commands == (f"touch {tmp_path / 'two.spark-a'}",)
    assert (tmp_path / "one.spark-a").exists() and (tmp_path / "two.spark-a").exists()
    owner = json.loads((tmp_path / "state" / "lock" / "owner").read_text())
    assert owner["command"] == "launch"


def test_a_failed_command_names_its_step_and_the_steps_after_it_do_not_run(
        launch: Any, tmp_path: Path) -> None:
    report, _ = launch([Touch("one", tmp_path / "one"),
                        Touch("two", tmp_path / "two", "echo no space left >&2; exit 3"),
                        Touch("three", tmp_path / "three")])
    steps = {s.step: s for s in report.hosts["spark-a"].steps}
    assert steps["one"].status == "changed" and "three" not in steps
    assert steps["two"].status == "failed"
    assert steps["two"].message == ("spark-a: `echo no space left >&2; exit 3` failed (exit 3): "
                                    "no space left")
    assert not (tmp_path / "three.spark-a").exists() and not report.ok


def test_a_step_that_keeps_going_is_skipped_and_the_batch_goes_on(
        launch: Any, tmp_path: Path) -> None:
    report, _ = launch([Warns("drop", tmp_path / "drop", "echo read-only >&2; exit 2"),
                        Touch("two", tmp_path / "two")])
    steps = {s.step: s for s in report.hosts["spark-a"].steps}
    assert steps["drop"].status == "skipped" and steps["drop"].message == "skipped: read-only"
    assert steps["two"].status == "changed" and report.ok


def test_a_lock_taken_since_the_look_stops_the_batch_before_anything_runs(
        launch: Any, tmp_path: Path) -> None:
    def another_run_took_it() -> None:
        (tmp_path / "state").mkdir(exist_ok=True)
        (tmp_path / "state" / "lock-generation").write_text("99")

    report, _ = launch([Touch("one", tmp_path / "one"), Touch("two", tmp_path / "two")],
                       before_batch=another_run_took_it)
    (step,) = report.hosts["spark-a"].steps[1:]
    assert step.step == "one" and step.status == "failed"
    assert "another sparkctl run took the cluster lock" in step.message
    assert not (tmp_path / "one.spark-a").exists() and not (tmp_path / "state" / "lock").exists()


def test_changes_on_several_nodes_take_the_lock_first_with_its_own_round_trip(
        launch: Any, tmp_path: Path) -> None:
    report, transports = launch([Touch("one", tmp_path / "one"), Touch("two", tmp_path / "two")],
                                nodes=("spark-a", "spark-b"))
    head = requests(transports["spark-a"])
    assert "lock" in head[1] and "batch" not in head[1]  # taken alone, before any batch
    assert "lock" not in head[2] and len(head[2]["batch"]) == 2
    assert all("lock" not in r for r in requests(transports["spark-b"]))
    assert (tmp_path / "two.spark-b").exists() and report.ok
