"""core/runner.py and core/session.py: load, connect, lock, preview, confirm, execute, report."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import runner, session
from orchestrator.core.executor import Interrupted
from orchestrator.core.lock import LOCK_DIR
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Plan, Step, Unchanged
from orchestrator.errors import InputError, SparkctlError


class Touch(Step):
    """Changes a node whose facts do not show /x; applying runs `touch /x`."""

    name = "touch"

    def check(self, ctx: NodeContext) -> Outcome:
        if ctx.facts.exists("/x"):
            return Unchanged("already done")
        return Change("touch /x", diff="+x\n")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        ctx.run("touch /x", sudo=True).check()
        return None


class Interrupt(Touch):
    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        raise KeyboardInterrupt


def plan(step: Step | None = None) -> Plan:
    return Plan("up", [Phase("p", [step or Touch()], lambda inv, node: {"node": node.name})])


def node_facts(done: bool = False, held: bool = True) -> Any:
    def answer(request: dict[str, Any]) -> dict[str, Any]:
        facts: dict[str, Any] = {"files": {"/x": {"exists": done}}}
        if "lock" in request:
            facts["lock"] = {"held": held, "holder": {"command": "up", "user": "ann",
                                                      "controller": "elsewhere", "pid": 1}}
        return facts
    return answer


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def cluster(fake_cluster: Any, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fake cluster every connect in this module reaches (spark-b unreachable if asked)."""
    made: dict[str, Any] = {}

    def build(unreachable: dict[str, str] | None = None, done: bool = False, held: bool = True) -> Any:
        made["cluster"] = fake_cluster(facts={n: node_facts(done, held) for n in ("spark-a", "spark-b")},
                                       unreachable=unreachable)
        monkeypatch.setattr("orchestrator.remote.connect.connect_all", made["cluster"].connect_all)
        return made["cluster"]
    return build


def request(cluster: Any, **kwargs: Any) -> runner.RunRequest:
    kwargs.setdefault("build", lambda s: plan())
    return runner.RunRequest(command="up", inventory=cluster.inventory, **kwargs)


def touched(cluster: Any) -> list[str]:
    return sorted(node for node, command in cluster.journal if command == "touch /x")


def last_json(out: str) -> Any:
    """The JSON report at the end of stdout (an interactive run prints its preview before it)."""
    return json.loads(out[out.index("{\n") if out.startswith("{") else out.index("\n{\n") + 1:])


def confirm_with(monkeypatch: pytest.MonkeyPatch, answer: bool) -> list[str]:
    asked: list[str] = []
    monkeypatch.setattr("sys.stdin", Terminal())

    def confirm(text: str) -> bool:
        asked.append(text)
        return answer
    monkeypatch.setattr(runner, "ask_yes_no", confirm)
    return asked


# ------------------------------------------------------------------ load_inventory_option


def test_a_missing_inventory_is_bad_input_with_a_hint(state_dir: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="no --inventory given") as raised:
        runner.load_inventory_option(None)
    assert raised.value.exit_code == 2
    with pytest.raises(InputError) as given:
        runner.load_inventory_option(str(tmp_path / "nope.yml"))
    assert "nope.yml" in str(given.value) and "no --inventory given" not in str(given.value)


def test_an_inventory_file_is_loaded(state_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "inv.yml"
    path.write_text("cluster: {name: c, ssh_key: /k}\nnodes: [{name: n1, host: h1}]\n")
    inventory, found = runner.load_inventory_option(str(path))
    assert found == path and [n.name for n in inventory.nodes] == ["n1"]


# ------------------------------------------------------------------ execute


def test_yes_applies_everywhere_under_the_lock_and_releases_it(cluster: Any,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster()
    after: list[bool] = []
    code = runner.execute(request(c, yes=True, as_json=True,
                                  after=lambda s, report: after.append(report.ok)))
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["ok"] and payload["changed"] == 2
    assert touched(c) == ["spark-a", "spark-b"]
    head = c.commands("spark-a")
    assert any(call.request.get("lock") for call in c["spark-a"].calls if call.command.startswith("python3"))
    assert f"rm -rf {LOCK_DIR}" in head[-1]
    assert after == [True]
    assert Path(payload["log"]).exists()


def test_dry_run_shows_the_plan_and_changes_nothing(cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster()
    code = runner.execute(request(c, dry_run=True, as_json=True))
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and touched(c) == []
    assert payload["hosts"]["spark-a"]["steps"][0]["status"] == "planned"
    assert payload["hosts"]["spark-a"]["steps"][0]["diff"] == "+x\n"
    assert not any(LOCK_DIR in command for _, command in c.journal)


def test_every_node_must_be_reachable_unless_the_command_says_otherwise(
        cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster(unreachable={"spark-b": "cannot reach b:22"})
    code = runner.execute(request(c, yes=True, as_json=True))
    payload = json.loads(capsys.readouterr().out)
    assert code == 1 and c.journal == []
    assert payload["hosts"]["spark-b"]["error"] == "cannot reach b:22"
    assert "Nothing was changed" in payload["notes"][0] and "spark-b" in payload["notes"][0]


def test_no_reachable_node_at_all_fails_without_a_plan(cluster: Any,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster(unreachable={"spark-a": "down", "spark-b": "down"})
    built: list[bool] = []
    code = runner.execute(request(c, yes=True, require_all_nodes=False,
                                  build=lambda s: built.append(True) or plan()))
    assert code == 1 and built == []
    assert "FAILED" in capsys.readouterr().out


def test_without_a_terminal_it_asks_for_yes(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster()
    monkeypatch.setattr("sys.stdin", io.StringIO())
    with pytest.raises(InputError, match="pass --yes") as raised:
        runner.execute(request(c))
    assert raised.value.exit_code == 2 and touched(c) == []


def test_answering_no_changes_nothing(cluster: Any, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster()
    asked = confirm_with(monkeypatch, False)
    with pytest.raises(InputError, match="cancelled") as raised:
        runner.execute(request(c))
    assert raised.value.exit_code == 1 and touched(c) == []
    assert len(asked) == 1 and asked[0].startswith("Apply these changes to cluster ")
    assert "would change" in capsys.readouterr().out


def test_answering_yes_applies(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster()
    confirm_with(monkeypatch, True)
    assert runner.execute(request(c)) == 0
    assert touched(c) == ["spark-a", "spark-b"]


def test_nothing_to_change_is_not_asked(cluster: Any, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster(done=True)
    asked = confirm_with(monkeypatch, False)
    assert runner.execute(request(c)) == 0
    assert asked == [] and "Nothing to change." in capsys.readouterr().err


def test_a_plan_that_fails_in_preview_is_not_offered(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(Touch):
        def check(self, ctx: NodeContext) -> Outcome:
            raise SparkctlError("cannot plan")

    c = cluster()
    asked = confirm_with(monkeypatch, True)
    with pytest.raises(InputError, match="the plan itself failed"):
        runner.execute(request(c, build=lambda s: plan(Broken())))
    assert asked == [] and touched(c) == []


@pytest.mark.parametrize("interactive", [False, True], ids=["--yes", "confirmed at the prompt"])
def test_an_unreachable_node_stays_failed_however_the_run_is_confirmed(
        cluster: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        interactive: bool) -> None:
    """Issue #12 item 5: `down` with a node unreachable, answered yes at the prompt, exited 0."""
    c = cluster(unreachable={"spark-b": "cannot reach b:22"})
    if interactive:
        confirm_with(monkeypatch, True)
    code = runner.execute(request(c, yes=not interactive, as_json=True, require_all_nodes=False,
                                  lock_optional=True))
    payload = last_json(capsys.readouterr().out)
    assert touched(c) == ["spark-a"]
    assert code == 1 and not payload["ok"] and payload["failed"] == 1
    assert payload["hosts"]["spark-b"] == {"ok": False, "steps": [], "error": "cannot reach b:22"}


def test_lock_optional_runs_without_the_lock_when_the_head_is_gone(
        cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster(unreachable={"spark-a": "cannot reach a:22"})
    code = runner.execute(request(c, yes=True, as_json=True, require_all_nodes=False, lock_optional=True))
    payload = json.loads(capsys.readouterr().out)
    assert code == 1 and touched(c) == ["spark-b"]
    assert any("ran without the cluster lock" in note for note in payload["notes"])
    assert not any(LOCK_DIR in command for _, command in c.journal)


def test_the_lock_needs_the_head(cluster: Any) -> None:
    c = cluster(unreachable={"spark-a": "cannot reach a:22"})
    with pytest.raises(SparkctlError, match="cannot lock the cluster: the head spark-a is unreachable"):
        runner.execute(request(c, yes=True, require_all_nodes=False))
    assert touched(c) == []


def test_a_locked_cluster_is_left_alone(cluster: Any) -> None:
    c = cluster(held=False)
    with pytest.raises(SparkctlError, match="locked by another sparkctl run: up by ann@elsewhere"):
        runner.execute(request(c, yes=True))
    assert touched(c) == []
    assert not any(f"rm -rf {LOCK_DIR}" in command for _, command in c.journal)


def test_an_interrupt_reports_and_releases_the_lock(cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster()
    with pytest.raises(Interrupted):
        runner.execute(request(c, yes=True, as_json=True, build=lambda s: plan(Interrupt())))
    payload = json.loads(capsys.readouterr().out)
    assert any(note.startswith("Interrupted: changes made: none") for note in payload["notes"])
    assert f"rm -rf {LOCK_DIR}" in c.commands("spark-a")[-1]


def test_a_failed_run_names_its_log(cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster()
    c["spark-b"].on("^touch", 1, "", "read-only file system")
    assert runner.execute(request(c, yes=True)) == 1
    captured = capsys.readouterr()
    assert "Run log: " in captured.err and "read-only file system" in captured.out


# ------------------------------------------------------------------ session


def test_open_session_reports_unreachable_nodes_and_closes_the_rest(fake_cluster: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    c = fake_cluster(unreachable={"spark-b": "cannot reach b:22"})
    monkeypatch.setattr("orchestrator.remote.connect.connect_all", c.connect_all)
    with session.open_session(c.inventory, "status", quiet=True) as s:
        assert s.unreachable == ["spark-b"]
        assert [n.name for n in s.reachable_nodes()] == ["spark-a"]
        assert s.report.hosts["spark-b"].error == "cannot reach b:22"
        assert not c["spark-a"].closed
    assert c["spark-a"].closed
    report = s.finish()
    assert report.seconds > 0 and report.command == "status"


def test_open_session_on_some_nodes_only(fake_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    c = fake_cluster()
    monkeypatch.setattr("orchestrator.remote.connect.connect_all", c.connect_all)
    with session.open_session(c.inventory, "logs", nodes=[c.inventory.node("spark-b")]) as s:
        assert list(s.report.hosts) == ["spark-b"] and list(s.transports) == ["spark-b"]


def test_run_plan_fills_the_sessions_report(fake_cluster: Any) -> None:
    from orchestrator.core.step import RunOptions

    c = fake_cluster(facts={"spark-a": {"files": {"/x": {"exists": True}}},
                            "spark-b": {"files": {"/x": {"exists": False}}}})
    s = c.session()
    report = session.run_plan(s, plan(), RunOptions(dry_run=True))
    assert report is s.report
    assert [st.status for st in report.hosts["spark-a"].steps] == ["ok"]
    assert [st.status for st in report.hosts["spark-b"].steps] == ["planned"]
