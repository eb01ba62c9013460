"""What the README says about every command must hold (issue 27, item 10: it said `--json` for
every command while logs, tunnel and `recipes list` had none; the commands without it are now
named, and this test fails when one gains or loses it without the README saying so)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from orchestrator.cli import cli

README = Path(__file__).resolve().parents[2] / "README.md"


def commands_without_json() -> set[str]:
    """Every product command (not a group, not the lab's) that has no --json option."""
    ctx = click.Context(cli)
    found: set[str] = set()

    def walk(group: click.Group, prefix: str) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            full = f"{prefix} {name}".strip()
            if command is None or full.startswith("lab"):
                continue
            if isinstance(command, click.Group) and command.list_commands(ctx):
                walk(command, full)  # (a group's own options: its subcommands' story)
            elif not any("--json" in p.opts for p in command.params):
                found.add(full)
    walk(cli, "")
    return found


def test_the_readme_names_exactly_the_commands_without_json() -> None:
    text = " ".join(README.read_text().split())
    claim = re.search(r"`--json` prints one JSON object on stdout \(.*?\), on every command "
                      r"except these, which write a file or serve a page and print text only: ([^.(]*)", text)
    assert claim, "the README's --json sentence changed: keep it exact, and this test with it"
    named = set(re.findall(r"`([^`]+)`", claim.group(1)))
    assert named == commands_without_json()


LAUNCH_MD = README.parent / "docs" / "launch.md"


def test_launch_md_synopsis_lists_every_option_once_and_claims_nothing_undone() -> None:
    text = LAUNCH_MD.read_text()
    synopsis = text.split("```")[1]
    ctx = click.Context(cli)
    for name in ("launch", "chat", "tunnel"):
        command = cli.get_command(ctx, name)
        assert command is not None
        lines = [ln for ln in synopsis.splitlines() if ln.startswith(f"sparkctl {name} ")]
        assert len(lines) == 1, f"{name}: one synopsis (was garbled: two half ones)"
        start = synopsis.index(lines[0])
        block = synopsis[start:].split("\nsparkctl ", 1)[0]
        for param in command.params:
            longs = [o for o in param.opts + param.secondary_opts if o.startswith("--")]
            if longs and "--help" not in longs:
                assert any(o in block for o in longs), f"sparkctl {name}: {longs[0]} missing"
    # persistence and the OOM guard exist (issue 19 was done): no page may say otherwise
    assert "Not done yet" not in text and "not done yet" not in text


def test_recipes_md_says_the_exit_code_memory_refusals_have(fake_transport: object) -> None:
    """A memory refusal from a check step (memory available now, SGLang's servers already
    running) exits 2 like the static estimate's, as recipes.md says (it said 2 while SGLang's
    exited 1)."""
    from orchestrator.core.executor import Executor
    from orchestrator.core.progress import Progress
    from orchestrator.core.report import Report
    from orchestrator.core.step import NodeContext, Outcome, Phase, Plan, RunOptions, Step
    from orchestrator.errors import InputError
    from orchestrator.inventory_checks import inventory_from_data

    class Refuses(Step):
        name = "memory"

        def check(self, ctx: NodeContext) -> Outcome:
            raise InputError("spark-a: the recipe does not fit in the memory available now")

    inventory = inventory_from_data({"cluster": {"name": "c", "ssh_key": "/k"},
                                     "nodes": [{"name": "spark-a", "host": "a"}]}, "inv.yml")
    report = Report("launch")
    report.host("spark-a")
    transports = {"spark-a": fake_transport("spark-a", facts={})}  # type: ignore[operator]
    Executor(inventory, transports, RunOptions(), report, Progress(quiet=True)).run(
        Plan("launch", [Phase("checks", [Refuses()], lambda inv, node: {})]))
    assert report.exit_code == 2  # a refusal from a check step is bad input, as the estimate's
    text = " ".join((README.parent / "docs" / "recipes.md").read_text().split())
    assert "is a refusal too, exit 2 for every engine" in text
