"""The executor: lock-step phases, failure handling, preview, and the report it builds."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator.core.executor import Executor
from orchestrator.core.progress import Progress
from orchestrator.core.report import Report
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Plan, RunOptions, Step, Unchanged
from orchestrator.errors import CommandError, SparkctlError
from orchestrator.inventory_checks import inventory_from_data

INVENTORY = inventory_from_data(
    {
        "cluster": {"name": "c", "ssh_key": "/k"},
        "nodes": [{"name": "spark-a", "host": "a"}, {"name": "spark-b", "host": "b"},
                  {"name": "spark-c", "host": "c"}],
    },
    "inv.yml",
)


class Recorder(Step):
    """Changes when facts say `want` differs from `have`; applies by running `echo NAME`."""

    def __init__(self, name: str, command: str = "echo") -> None:
        self.name = name
        self.command = command

    def check(self, ctx: NodeContext) -> Outcome:
        if ctx.facts.output("have") == ctx.facts.output("want"):
            return Unchanged("already right")
        return Change(f"set {self.name}", diff="-old\n+new\n")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        ctx.run(f"{self.command} {self.name}").check()
        return None


def said(have: int, want: int) -> dict[str, Any]:
    """A node's facts answer: what it has and what it should have (as two commands' output)."""
    return {"commands": {"have": {"rc": 0, "out": str(have)}, "want": {"rc": 0, "out": str(want)}}}


def facts_request(inventory: Any, node: Any) -> dict[str, Any]:
    return {"node": node.name}


@pytest.fixture
def run(fake_transport: Any) -> Any:
    """Runs a plan on fake nodes answering the gatherer with `facts`; `false` fails with boom."""
    def run_(plan: Plan, facts: dict[str, dict[str, Any]], dry_run: bool = False
             ) -> tuple[Report, list[tuple[str, str]]]:
        journal: list[tuple[str, str]] = []
        lock = threading.Lock()
        transports = {name: fake_transport(name, facts=f, journal=journal, journal_lock=lock)
                      .on(r"^false$", 1, "", "boom") for name, f in facts.items()}
        report = Report("up")
        for name in facts:
            report.host(name)
        Executor(INVENTORY, transports, RunOptions(dry_run=dry_run), report, Progress(quiet=True)).run(plan)
        return report, journal
    return run_


ALL_CHANGE = {n: said(1, 2) for n in ("spark-a", "spark-b", "spark-c")}


def test_phases_run_in_lock_step(run: Any) -> None:
    plan = Plan("up", [Phase("one", [Recorder("s1"), Recorder("s2")], facts_request),
                       Phase("two", [Recorder("s3")], facts_request)])
    report, journal = run(plan, ALL_CHANGE)
    assert report.ok and report.count("changed") == 9
    order = [cmd.split()[-1] if not cmd.startswith("python3") else "facts" for _, cmd in journal]
    # every node finished s1 before any node ran s2, and phase one before phase two
    assert max(i for i, c in enumerate(order) if c == "s1") < min(i for i, c in enumerate(order) if c == "s2")
    assert max(i for i, c in enumerate(order) if c == "s2") < min(i for i, c in enumerate(order) if c == "s3")


def test_unchanged_steps_cost_only_the_facts_round_trip(run: Any) -> None:
    same = {n: said(1, 1) for n in ("spark-a", "spark-b", "spark-c")}
    plan = Plan("up", [Phase("one", [Recorder("s1"), Recorder("s2")], facts_request)])
    report, journal = run(plan, same)
    assert report.count("changed") == 0 and report.count("ok") == 6
    assert len(journal) == 3 and all(cmd.startswith("python3 - ") for _, cmd in journal)


def test_a_failed_node_stops_the_run_after_the_phase(run: Any) -> None:
    failing = {"spark-a": said(1, 2), "spark-b": said(1, 2),
               "spark-c": said(1, 2)}
    plan = Plan("up", [
        Phase("one", [Recorder("s1"), Recorder("s2")], facts_request),
        Phase("two", [Recorder("s3")], facts_request),
    ])
    # make spark-b's first step fail
    plan.phases[0].steps[0] = _FailOn("spark-b")
    report, journal = run(plan, failing)
    assert not report.ok and report.exit_code == 1
    b_steps = [(s.step, s.status) for s in report.hosts["spark-b"].steps]
    assert b_steps == [("s1", "failed")]  # its s2 did not run
    a_steps = [(s.step, s.status) for s in report.hosts["spark-a"].steps]
    assert a_steps == [("s1", "changed"), ("s2", "changed")]  # others finish the phase
    assert not any("s3" in cmd for _, cmd in journal)  # phase two never ran
    assert any("not run: two" in note for note in report.notes)
    failure = report.hosts["spark-b"].steps[0].message
    assert "spark-b" in failure and "exited 1" in failure and "boom" in failure


class _FailOn(Recorder):
    def __init__(self, node: str) -> None:
        super().__init__("s1")
        self.node = node

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        command = "false" if ctx.node.name == self.node else "echo s1"
        ctx.run(command).check()
        return None


def test_dry_run_applies_nothing_and_reports_diffs(run: Any) -> None:
    plan = Plan("up", [Phase("one", [Recorder("s1")], facts_request)])
    report, journal = run(plan, ALL_CHANGE, dry_run=True)
    assert all(cmd.startswith("python3 - ") for _, cmd in journal)
    assert report.count("planned") == 3
    payload = report.to_json()
    assert payload["changed"] == 3 and payload["hosts"]["spark-a"]["steps"][0]["diff"] == "-old\n+new\n"


def test_head_scoped_steps_run_on_the_head_only(run: Any) -> None:
    step = Recorder("headonly")
    step.scope = "head"
    _, journal = run(Plan("up", [Phase("one", [step], facts_request)]), ALL_CHANGE)
    assert [n for n, c in journal if c == "echo headonly"] == ["spark-a"]


class OnServerNode(Recorder):
    """A head-scoped step about one server's node (its readiness, its smoke test)."""

    scope = "head"

    def __init__(self, name: str, node: str) -> None:
        super().__init__(name)
        self.node = node

    def runs_on(self, inventory: Any) -> str:
        return self.node


def test_a_step_about_a_servers_node_runs_and_is_reported_there(run: Any) -> None:
    # a replica relaunched on spark-b: its ready and smoke-test lines are spark-b's, not the head's
    report, journal = run(Plan("launch", [Phase("serve", [OnServerNode("ready", "spark-b")],
                                                facts_request)]), ALL_CHANGE)
    assert [n for n, c in journal if c == "echo ready"] == ["spark-b"]
    assert [s.step for s in report.hosts["spark-b"].steps] == ["ready"]
    assert report.hosts["spark-a"].steps == []
    # a node the phase does not cover: the head, as before (never silently skipped)
    from orchestrator.phases.models import ServingPhase

    narrow = ServingPhase("serve", [OnServerNode("ready", "spark-c")], facts_request,
                          serving=["spark-a", "spark-b"])
    _, journal = run(Plan("launch", [narrow]), ALL_CHANGE)
    assert [n for n, c in journal if c == "echo ready"] == ["spark-a"]


def test_readiness_and_smoke_tests_run_on_the_servers_first_node() -> None:
    from orchestrator.engines import load_recipe, placed, verify
    from orchestrator.engines.sglang import ENGINE as SGLANG
    from orchestrator.recipe import LaunchOptions

    recipe = load_recipe("qwen3-8b").model_copy(update={"placement": ["spark-b"]})
    inventory = inventory_from_data({"cluster": {"name": "c", "ssh_key": "/k"}, "nodes": [
        {"name": "spark-a", "host": "a"}, {"name": "spark-b", "host": "b"}]}, "inv.yml")
    phases = SGLANG.launch_phases(recipe, inventory, LaunchOptions(name="r-b"))
    steps = [s for p in phases for s in p.steps if isinstance(s, (verify.WaitReady, placed.Smoke))]
    assert [(s.name, s.runs_on(inventory)) for s in steps] == [("ready", "spark-b"),
                                                               ("smoke-test", "spark-b")]
    assert "keeps loading on spark-b" in (steps[0].interrupt_hint(inventory) or "")


def test_internal_errors_become_a_failed_step_not_a_crash(run: Any) -> None:
    class Broken(Recorder):
        def check(self, ctx: NodeContext) -> Outcome:
            raise KeyError("oops")

    report, _ = run(Plan("up", [Phase("one", [Broken("x")], facts_request)]), ALL_CHANGE)
    messages = [s.message for h in report.hosts.values() for s in h.steps]
    assert all("internal error: KeyError" in m for m in messages)


def test_json_report_contract(run: Any) -> None:
    report, _ = run(Plan("up", [Phase("one", [Recorder("s1")], facts_request)]), ALL_CHANGE)
    payload = report.to_json()
    assert set(payload) >= {"command", "ok", "seconds", "changed", "failed", "hosts"}
    step = payload["hosts"]["spark-a"]["steps"][0]
    assert set(step) >= {"phase", "step", "status", "seconds", "message"}
    assert step["status"] in ("ok", "changed", "failed", "skipped")


def test_command_error_message_names_everything() -> None:
    error = CommandError("spark-b", "docker run x", 125, "line1\nport 2233 in use\n")
    assert isinstance(error, SparkctlError)
    assert str(error) == "spark-b: `docker run x` exited 125:\nline1\nport 2233 in use"


def test_secret_never_reaches_a_command_line() -> None:
    from orchestrator.commands import Secret, join

    token = Secret("hf_sentinel")
    assert str(token) == "***" and "hf_sentinel" not in repr(token)
    with pytest.raises(TypeError):
        join(["echo", token])


def test_changed_steps_are_recorded_for_later_verification(run: Any) -> None:
    shared_seen: list[list[str]] = []

    class Verify(Step):
        name = "verify"
        kind = "verify"

        def apply(self, ctx: NodeContext, change: Change) -> str | None:
            shared_seen.append(list(ctx.shared.changed_steps))
            return "ok"

    plan = Plan("up", [Phase("one", [Recorder("s1")], facts_request),
                       Phase("two", [Verify()], facts_request)])
    run(plan, {"spark-a": said(1, 2), "spark-b": said(1, 1)})
    assert shared_seen[0] == ["spark-a: one/s1"]


def test_no_change_run_gathers_facts_once_per_node_for_all_phases(run: Any) -> None:
    same = {n: said(1, 1) for n in ("spark-a", "spark-b", "spark-c")}
    plan = Plan("up", [Phase(f"p{i}", [Recorder(f"s{i}")], facts_request) for i in range(4)])
    report, journal = run(plan, same)
    assert report.count("ok") == 12
    assert sorted(node for node, _ in journal) == ["spark-a", "spark-b", "spark-c"]


def test_after_a_change_later_phases_gather_fresh_facts(run: Any) -> None:
    plan = Plan("up", [Phase(f"p{i}", [Recorder(f"s{i}")], facts_request) for i in range(3)])
    _, journal = run(plan, {"spark-a": said(1, 2)})
    gathers = [cmd for _, cmd in journal if cmd.startswith("python3 - ")]
    # one prefetch; p0 uses it and changes something; p1 and p2 gather again
    assert len(gathers) == 3


def test_a_phase_gathers_again_only_after_a_change_of_a_phase_it_names(run: Any) -> None:
    """Phase.stale_after: the facts gathered up front serve a later phase as long as none of
    the phases it names changed anything (a launch's persist and gateway checks after its
    serve phase started the server), and a change of a named phase still refreshes them."""
    def plan(stale_after: tuple[str, ...]) -> Plan:
        return Plan("launch", [Phase("serve", [Recorder("s0")], facts_request),
                               Phase("persist", [Recorder("s1")], facts_request,
                                     stale_after=stale_after)])

    _, journal = run(plan(()), {"spark-a": said(1, 2)})
    assert len([cmd for _, cmd in journal if cmd.startswith("python3 - ")]) == 1
    _, journal = run(plan(("serve",)), {"spark-a": said(1, 2)})
    assert len([cmd for _, cmd in journal if cmd.startswith("python3 - ")]) == 2


def test_merge_requests_answers_every_phase() -> None:
    from orchestrator.remote.facts import merge_requests

    merged = merge_requests([
        {"files": {"/a": True}, "links": True, "containers": ["x"], "timeout": 30},
        {"files": {"/a": False, "/b": False}, "links": False, "containers": ["x", "y"], "timeout": 60,
         "commands": {"v": "docker version"}},
    ])
    assert merged == {"files": {"/a": True, "/b": False}, "links": True, "containers": ["x", "y"],
                      "timeout": 60, "commands": {"v": "docker version"}}


class Commands(Step):
    """A step that only lists its commands: the default apply runs them."""

    name = "listed"

    def __init__(self, *commands: str) -> None:
        self.commands = commands

    def check(self, ctx: NodeContext) -> Outcome:
        return Change("run the list", commands=self.commands)


def test_a_change_that_lists_commands_is_applied_by_running_them_in_order(run: Any) -> None:
    plan = Plan("up", [Phase("one", [Commands("echo one", "echo two")], facts_request)])
    report, journal = run(plan, {"spark-a": {}})
    assert [cmd for _, cmd in journal if cmd.startswith("echo")] == ["echo one", "echo two"]
    (step,) = report.hosts["spark-a"].steps
    assert step.status == "changed" and step.to_json()["commands"] == ["echo one", "echo two"]


def test_the_dry_run_shows_the_commands_and_runs_none(run: Any) -> None:
    plan = Plan("up", [Phase("one", [Commands("echo one")], facts_request)])
    report, journal = run(plan, {"spark-a": {}}, dry_run=True)
    assert not [cmd for _, cmd in journal if cmd.startswith("echo")]
    (step,) = report.hosts["spark-a"].steps
    assert step.status == "planned" and step.commands == ("echo one",)


def test_the_first_failing_command_stops_the_step_and_is_named(run: Any) -> None:
    plan = Plan("up", [Phase("one", [Commands("echo one", "false", "echo never")], facts_request)])
    report, journal = run(plan, {"spark-a": {}})
    assert "echo never" not in [cmd for _, cmd in journal]
    (step,) = report.hosts["spark-a"].steps
    assert step.status == "failed"
    assert step.message == "spark-a: `false` failed (exit 1): boom"


def test_a_change_without_commands_needs_an_apply(run: Any) -> None:
    plan = Plan("up", [Phase("one", [Commands()], facts_request)])
    report, _ = run(plan, {"spark-a": {}})
    (step,) = report.hosts["spark-a"].steps
    assert step.status == "failed" and "lists no commands and has no apply()" in step.message


def test_a_drop_caches_that_failed_is_skipped_never_ticked(fake_transport: Any) -> None:
    """/proc/sys read-only (the lab, some containers): the run goes on, but the step is shown
    skipped with why, never with the success tick of a change (issue 27)."""
    import io

    from orchestrator.phases.memory import DROP_CACHES, DropCaches

    transports = {"spark-a": fake_transport("spark-a", facts={}).on(
        r"drop_caches", 1, "", "sh: 1: cannot create /proc/sys/vm/drop_caches: Read-only file system")}
    report = Report("launch")
    report.host("spark-a")
    stream = io.StringIO()
    Executor(INVENTORY, transports, RunOptions(), report, Progress(stream=stream)).run(
        Plan("launch", [Phase("serve", [DropCaches(lambda ctx: None)], facts_request)]))
    (step,) = report.hosts["spark-a"].steps
    assert step.status == "skipped" and step.commands == (DROP_CACHES,)
    assert step.message.startswith("skipped: could NOT drop the page cache (sh: 1: cannot create")
    line = next(ln for ln in stream.getvalue().splitlines() if "drop-caches" in ln)
    assert "✓" not in line and "- spark-a drop-caches: skipped: could NOT drop" in line
    assert report.ok  # a warning, not a failure
