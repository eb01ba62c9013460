"""What people read (issue 20, items 12-14): plans summarise their diffs per file (--diff: in
full, each distinct diff once); off a terminal every command prints plain lines, never a box
table squeezed or wrapped, and never the streamed steps a second time; key proofs and
measurements get a line without -v. stdout is captured here, so it is not a terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import cluster_of
from test_cli import INVENTORY, sparkctl
from test_runner import node_facts, request
from test_status import INVENTORY as STATUS_INVENTORY
from test_status import node_facts as status_facts

from orchestrator.cli import netcheck as cli_netcheck
from orchestrator.core import diffs, output, runner
from orchestrator.core.report import Report, StepResult, render_report
from orchestrator.core.step import Change, NodeContext, NotVerified, Outcome, Phase, Plan, Step
from orchestrator.netcheck.checks import CheckResult
from orchestrator.render import unified_diff
from orchestrator.status import assess as status
from orchestrator.status import render as status_render

BOX = ("│", "┃", "━", "─", "┏", "└")
LONG = ("spark-b enp1s0f1np1 negotiated 100000 Mb/s, below the 200000 Mb/s a Spark's ConnectX-7 "
        "port gives: reseat the QSFP cable, try the other port, or check the switch port's speed "
        "setting; --deep measures what the link really carries")


class WriteFiles(Step):
    """Writes a node-specific file and a file that is the same everywhere."""

    name = "files"

    def check(self, ctx: NodeContext) -> Outcome:
        mine = unified_diff("/etc/sparkctl/mine.yaml", None, f"a: 1\nnode: {ctx.node.name}\nb: 2\n")
        same = unified_diff("/etc/sparkctl/same", "old\n", "new\nmore\n")
        return Change("write mine.yaml, same", diff=mine + same)

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        return None


class Fails(Step):
    name = "boom"

    def check(self, ctx: NodeContext) -> Outcome:
        return Change("do it")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        if ctx.node.name == "spark-a":
            from orchestrator.errors import SparkctlError

            raise SparkctlError(LONG)
        return "done it"


class Proves(Step):
    name = "mpirun"
    kind = "verify"

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        if ctx.node.name == "spark-a":
            return "mpirun -np 2 hostname reached spark-a, spark-b"
        return NotVerified("not re-run: nothing changed")


@pytest.fixture
def cluster(fake_cluster: Any, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Two reachable fake nodes every connect reaches."""
    made = fake_cluster(facts={n: node_facts() for n in ("spark-a", "spark-b")})
    monkeypatch.setattr("orchestrator.remote.connect.connect_all", made.connect_all)
    return made


@pytest.fixture
def inv(tmp_path: Path, state_dir: Path) -> str:
    path = tmp_path / "two.yml"
    path.write_text(INVENTORY)
    return str(path)


def run(cluster: Any, steps: list[Step], **kwargs: Any) -> int:
    built = Plan("up", [Phase("p", steps, lambda inventory, node: {"node": node.name})])
    return runner.execute(request(cluster, build=lambda s: built, **kwargs))


# ------------------------------------------------------------------ 12: diffs per file


def test_a_plan_shows_a_line_per_changed_file_with_its_nodes(
        cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(cluster, [WriteFiles()], dry_run=True) == 0
    out = capsys.readouterr().out
    assert "/etc/sparkctl/mine.yaml: new file (3 lines) on spark-a, spark-b" in out, out
    assert "/etc/sparkctl/same: changed (+2 -1 lines) on spark-a, spark-b" in out
    assert "node: spark-a" not in out and "+++" not in out, "no diff text without --diff"
    assert "--diff" in out


def test_diff_shows_each_distinct_diff_once_with_its_nodes(
        cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(cluster, [WriteFiles()], dry_run=True, full_diff=True) == 0
    out = capsys.readouterr().out
    assert out.count("+++ /etc/sparkctl/same") == 1 and "=== spark-a, spark-b: /etc/sparkctl/same" in out
    assert "=== spark-a: /etc/sparkctl/mine.yaml" in out and "+node: spark-a" in out
    assert "=== spark-b: /etc/sparkctl/mine.yaml" in out and "+node: spark-b" in out


def test_the_diff_option_reaches_the_run(inv: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    monkeypatch.setattr("orchestrator.core.runner.execute",
                        lambda request: seen.append(request.full_diff) or 0)
    for args in (("plan", "--diff"), ("up", "--dry-run", "--diff"), ("down", "--dry-run", "--diff"),
                 ("plan",)):
        result = sparkctl(*args, "-i", inv)
        assert result.exit_code == 0, result.output
    assert seen == [True, True, True, False]


class Listed(Step):
    """Lists its commands (Change.commands): the plan with --diff shows them, once for the
    nodes where they are the same."""

    name = "listed"

    def check(self, ctx: NodeContext) -> Outcome:
        return Change("drop caches", commands=("sync; echo 3 > /proc/sys/vm/drop_caches",
                                               f"echo {ctx.node.name}"))


def test_diff_also_lists_the_commands_each_step_would_run(
        cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(cluster, [Listed()], dry_run=True, full_diff=True) == 0
    out = capsys.readouterr().out
    assert "  spark-a, spark-b p/listed: sync; echo 3 > /proc/sys/vm/drop_caches" in out, out
    assert "  spark-a p/listed: echo spark-a" in out and "  spark-b p/listed: echo spark-b" in out
    assert run(cluster, [Listed()], dry_run=True) == 0
    assert "drop_caches" not in capsys.readouterr().out  # (only with --diff)


def test_diff_sections_name_files_modes_secrets_and_free_text() -> None:
    text = (unified_diff("/etc/a", None, "x\n") + "/etc/b: mode 644 -> 600\n"
            + "/etc/c: secret content (not shown)\n" + "enp1: add 10.0.0.1/24\n")
    found = [(s.target, s.summary) for s in diffs.split(text, "network/apply")]
    assert found == [("/etc/a", "new file (1 line)"), ("/etc/b", "mode 644 -> 600"),
                     ("/etc/c", "changed (secret content, not shown)"),
                     ("network/apply", "1 line of detail (--diff shows them)")]
    removed = diffs.split(unified_diff("/etc/a", "x\ny\n", "").replace("+++ /etc/a", "+++ /dev/null"), "s")
    assert [(s.target, s.summary) for s in removed] == [("/etc/a", "removed (2 lines)")]


# ------------------------------------------------------------------ 13: off a terminal


def test_a_run_off_a_terminal_prints_no_table_and_no_step_twice(
        cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(cluster, [Fails()], yes=True) == 1
    captured = capsys.readouterr()
    assert not any(c in captured.out for c in BOX), captured.out
    assert f"failed spark-a p/boom: {LONG}\n" in captured.out, "each failure in full, one line"
    assert "done it" in captured.err and "done it" not in captured.out, "streamed once, not repeated"
    assert "FAILED up: 2 node(s), 1 changed, 1 failed" in captured.out


def test_netcheck_off_a_terminal_is_one_plain_line_per_check(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    results = [CheckResult("speed", "spark-b", "warn", LONG, interface="enp1s0f1np1", value=100000,
                           unit="Mb/s", fix="reseat the cable")]
    cli_netcheck.render(results, 1.0, verbose=False)
    out = capsys.readouterr().out
    assert not any(c in out for c in BOX), out
    assert out.count(LONG) == 1 and f"warn speed: {LONG}" in out
    assert "    fix: reseat the cable" in out


def test_status_and_tables_off_a_terminal_are_plain_unwrapped_lines(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    facts = {"spark-a": status_facts("spark-a"), "spark-b": status_facts("spark-b")}
    status_render.render_status({**status.assess(STATUS_INVENTORY, cluster_of(facts), {}), "seconds": 1.0})
    out = capsys.readouterr().out
    assert not any(c in out for c in BOX), out
    lines = out.splitlines()
    assert any(line.startswith("spark-a (head)") and "enp1s0f1np1" in line for line in lines), out
    output.print_table("t", ["name", "n", "message"], [["a", "1", LONG], ["bb", "22", "short"]],
                       right=["n"])
    assert capsys.readouterr().out.splitlines() == [
        "t", "name   n  message", f"a      1  {LONG}", "bb    22  short"]


# ------------------------------------------------------------------ 14: proofs and measurements


def test_proofs_get_a_line_without_verbose(cluster: Any, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(cluster, [Proves()], yes=True) == 0
    captured = capsys.readouterr()
    assert "✓ spark-a mpirun: mpirun -np 2 hostname reached spark-a, spark-b" in captured.err
    assert "not re-run" not in captured.err
    report = Report("up")
    report.add("spark-a", StepResult("mpi", "mpirun", "ok", message="reached spark-a", proof=True))
    report.add("spark-b", StepResult("mpi", "mpirun", "ok", message="not re-run"))
    monkeypatch.setattr(output, "on_terminal", lambda: True)
    monkeypatch.setenv("COLUMNS", "200")
    render_report(report)
    out = capsys.readouterr().out
    assert "reached spark-a" in out and "not re-run" not in out and "1 already right" in out


def test_netcheck_shows_measurements_and_the_mpirun_proof_without_verbose(
        capsys: pytest.CaptureFixture[str]) -> None:
    results = [CheckResult("ping", "spark-a", "pass", f"link {i} answers.") for i in range(41)]
    results += [
        CheckResult("mpirun", "spark-a", "pass", "mpirun reached every container: spark-a, spark-b.",
                    value=1.2, unit="s"),
        CheckResult("throughput", "spark-a", "pass", "spark-a enp1s0f1np1 -> spark-b: 8.41 Gb/s.",
                    peer="spark-b", interface="enp1s0f1np1", value=8.41, unit="Gb/s", threshold=5.0),
        CheckResult("latency", "spark-a", "pass", "spark-a enp1s0f1np1 -> spark-b: 0.046 ms average.",
                    peer="spark-b", interface="enp1s0f1np1", value=0.046, unit="ms", threshold=5.0),
        CheckResult("nccl-busbw", "spark-a", "pass", "all_gather_perf: bus bandwidth 23.70 GB/s.",
                    value=23.7, unit="GB/s", threshold=21.9),
    ]
    cli_netcheck.render(results, 1.0, verbose=False)
    out = capsys.readouterr().out
    assert "link 3 answers" not in out
    assert "pass mpirun spark-a: mpirun reached every container: spark-a, spark-b." in out, out
    assert "pass throughput: spark-a enp1s0f1np1 -> spark-b: 8.41 Gb/s. (threshold 5 Gb/s)" in out
    assert "pass latency: spark-a enp1s0f1np1 -> spark-b: 0.046 ms average. (threshold 5 ms)" in out
    assert "pass nccl-busbw spark-a: all_gather_perf: bus bandwidth 23.70 GB/s. (threshold 21.9 GB/s)" in out



@pytest.mark.parametrize(("typed", "agreed"), [("y\n", True), ("YES\n", True), ("\n", False),
                                               ("n\n", False), ("", False), ("yep\n", False)])
def test_the_question_is_asked_on_stderr_and_only_yes_agrees(
        typed: str, agreed: bool, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import io

    from orchestrator.core.output import ask_yes_no

    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    assert ask_yes_no("Apply these changes?") is agreed
    captured = capsys.readouterr()
    assert captured.err == "Apply these changes? [y/N]: " and captured.out == ""


def test_the_cli_options_set_the_settings_for_one_command_only() -> None:
    import click
    from click.testing import CliRunner

    from orchestrator.cli import diff_option
    from orchestrator.core import output

    seen: list[tuple[bool, int]] = []

    @click.command()
    @diff_option
    def probe() -> None:
        seen.append((output.full_diff_requested(), output.verbosity()))

    assert CliRunner().invoke(probe, ["--diff"]).exit_code == 0
    assert CliRunner().invoke(probe, []).exit_code == 0
    assert seen == [(True, 0), (False, 0)]
    assert (output.SETTINGS.full_diff, output.SETTINGS.verbosity) == (False, 0)


def test_quiet_silences_a_steps_progress_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 41: `up -q` still printed `docker pull` progress (steps say it through RunOptions.note)
    from orchestrator.core import output
    from orchestrator.core.context import RunOptions

    said: list[str] = []
    options = RunOptions(progress_note=said.append)
    options.note("pulling 1.2 GB / 9 GB")
    monkeypatch.setattr(output.SETTINGS, "verbosity", -1)
    options.note("pulling 2.4 GB / 9 GB")
    assert said == ["pulling 1.2 GB / 9 GB"]
