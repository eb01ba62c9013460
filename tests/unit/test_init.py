"""`sparkctl init`: the port choice from ibdev2netdev, the inventory it writes (which must load
as `plan` loads it), the refusals, and the command's glue (connections replaced by NodeLinks)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.cli.init import Probed
from orchestrator.errors import InputError
from orchestrator.inventory_checks import inventory_from_data, load_inventory
from orchestrator.netcheck.cabling import (
    InitSettings,
    NodeLinks,
    choose_port,
    inventory_text,
    node_names,
    parse_ibdev2netdev,
)
from orchestrator.netcheck.layout import Layout, Reach, choose_layout

UNPROBED = Reach([], probed=False)


def layout(nodes: list[NodeLinks]) -> Layout:
    """The layout without a link-local probe (the port Up everywhere)."""
    return choose_layout(nodes, UNPROBED)


def unprobed(nodes: list[NodeLinks]) -> Probed:
    return Probed(nodes, [{} for _ in nodes], [None for _ in nodes])  # netplan not read

SPARK = """rocep1s0f0 port 1 ==> enp1s0f0np0 ({p0})
rocep1s0f1 port 1 ==> enp1s0f1np1 ({p1})
roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 ({p0})
roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 ({p1})
"""


def node(host: str, p0: str = "Down", p1: str = "Down", hostname: str = "",
         management: str = "enP7s7") -> NodeLinks:
    return NodeLinks(host, hostname or host, parse_ibdev2netdev(SPARK.format(p0=p0, p1=p1)),
                     management)


def test_parse_reads_every_line_and_ignores_noise() -> None:
    states = parse_ibdev2netdev(SPARK.format(p0="Up", p1="Down") + "garbage\n")
    assert states == {"enp1s0f0np0": "Up", "enp1s0f1np1": "Down",
                      "enP2p1s0f0np0": "Up", "enP2p1s0f1np1": "Down"}


def test_port_0_when_only_port_0_is_up_everywhere_and_says_why() -> None:
    choice = choose_port([node("a", p0="Up"), node("b", p0="Up")])
    assert choice.interfaces == ("enp1s0f0np0", "enP2p1s0f0np0")
    assert "port 0" in choice.reason and "port 1 is not Up on a, b" in choice.reason


def test_both_ports_up_picks_port_1_the_default() -> None:
    choice = choose_port([node("a", "Up", "Up"), node("b", "Up", "Up")])
    assert choice.port == "port 1" and "both ports" in choice.reason


def test_a_node_with_no_up_port_is_refused_naming_it() -> None:
    with pytest.raises(InputError, match=r"inconsistent.*\bb \(b\): enp1s0f1np1 Down"):
        choose_port([node("a", p1="Up"), node("b")])


def test_one_twin_up_is_not_a_usable_port() -> None:
    half = NodeLinks("b", "b", {"enp1s0f1np1": "Up", "enP2p1s0f1np1": "Down"})
    with pytest.raises(InputError, match="no QSFP port has both twins Up"):
        choose_port([node("a", p1="Up"), half])


def test_different_ports_cabled_are_refused() -> None:
    with pytest.raises(InputError, match=r"different ports \(a: port 1; b: port 0\)"):
        choose_port([node("a", p1="Up"), node("b", p0="Up")])


def test_names_from_hostnames_or_numbered_when_unusable() -> None:
    assert node_names([node("h1", hostname="Spark-A.lan"), node("h2", hostname="spark-b")]) \
        == ["spark-a", "spark-b"]
    assert node_names([node("h1", hostname="x"), node("h2", hostname="x")]) == ["spark-1", "spark-2"]
    assert node_names([node("h1", hostname="bad_name")]) == ["spark-1"]


def test_written_inventory_loads_with_one_subnet_per_twin(tmp_path: Path) -> None:
    nodes = [node("10.0.0.11", p0="Up", hostname="spark-a", management="eth0"),
             node("10.0.0.12", p0="Up", hostname="spark-b", management="eth0"),
             node("10.0.0.13", p0="Up", hostname="spark-c", management="eth0")]
    settings = InitSettings("lab", "nvidia", "/keys/id: x", "~/kh")
    text = inventory_text(settings, nodes, layout(nodes))
    assert text.startswith("# Written by `sparkctl init`")
    path = tmp_path / "inv.yml"
    path.write_text(text)
    inventory = load_inventory(path)
    assert inventory.fabric.interfaces == ["enp1s0f0np0", "enP2p1s0f0np0"]
    assert inventory.topology == "switch" and inventory.cluster.management_interface == "eth0"
    assert inventory.cluster.ssh_key == "/keys/id: x"
    assert [n.addresses for n in inventory.nodes][2] == {
        "enp1s0f0np0": "192.168.200.14/24", "enP2p1s0f0np0": "192.168.201.14/24"}


def test_mixed_management_interfaces_leave_the_default() -> None:
    nodes = [node("a", p1="Up", management="eth0"), node("b", p1="Up", management="")]
    data = yaml.safe_load(inventory_text(InitSettings("x", None, None, None), nodes,
                                         layout(nodes)))
    assert "management_interface" not in data["cluster"]
    assert inventory_from_data(data, "t").topology == "b2b"


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> list[NodeLinks]:
    found = [node("10.0.0.11", p0="Up", hostname="spark-a"),
             node("10.0.0.12", p0="Up", hostname="spark-b")]
    monkeypatch.setattr("orchestrator.cli.init._probe", lambda *args: unprobed(found))
    return found


def test_cli_writes_with_yes_and_says_which_port(probed: list[NodeLinks], tmp_path: Path) -> None:
    out = tmp_path / "inv.yml"
    result = CliRunner().invoke(cli, ["init", "10.0.0.11", "10.0.0.12", "-o", str(out), "--yes"])
    assert result.exit_code == 0, result.output
    assert "port 0 (enp1s0f0np0, enP2p1s0f0np0) is Up on all 2 nodes" in result.output
    assert load_inventory(out).nodes[0].name == "spark-a"


def test_cli_refuses_without_a_terminal_and_without_yes(probed: list[NodeLinks],
                                                       tmp_path: Path) -> None:
    out = tmp_path / "inv.yml"
    result = CliRunner().invoke(cli, ["init", "a", "b", "-o", str(out)])
    assert result.exit_code == 2 and "add --yes" in result.output and not out.exists()


def test_cli_inconsistent_cabling_exits_2_and_writes_nothing(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    monkeypatch.setattr("orchestrator.cli.init._probe",
                        lambda *args: unprobed([node("a", p1="Up"), node("b", p0="Up")]))
    out = tmp_path / "inv.yml"
    result = CliRunner().invoke(cli, ["init", "a", "b", "-o", str(out), "--yes"])
    assert result.exit_code == 2 and "different ports" in result.output and not out.exists()


def test_cli_bad_name_is_refused_before_writing(probed: list[NodeLinks], tmp_path: Path) -> None:
    out = tmp_path / "inv.yml"
    result = CliRunner().invoke(cli, ["init", "a", "b", "--name", "Bad Name", "-o", str(out), "--yes"])
    assert result.exit_code == 2 and "cluster.name" in result.output and not out.exists()


def test_cli_needs_hosts_and_refuses_a_host_twice() -> None:
    assert CliRunner().invoke(cli, ["init"]).exit_code == 2
    twice = CliRunner().invoke(cli, ["init", "a", "a"])
    assert twice.exit_code == 2 and "named twice" in twice.output


def test_example_is_the_shipped_inventory_and_loads(tmp_path: Path) -> None:
    printed = CliRunner().invoke(cli, ["init", "--example"])
    assert printed.exit_code == 0 and "name: two-sparks" in printed.output
    out = tmp_path / "example.yml"
    assert CliRunner().invoke(cli, ["init", "--example", "-o", str(out), "--yes"]).exit_code == 0
    assert load_inventory(out).cluster.name == "two-sparks"


def test_verbosity_flags_reach_the_renderer() -> None:
    import click

    from orchestrator.cli.verbosity import verbosity_option
    from orchestrator.core.output import verbosity

    seen: list[int] = []

    @click.command()
    @verbosity_option
    def probe() -> None:
        seen.append(verbosity())

    runner = CliRunner()
    for args, level in (([], 0), (["-v"], 1), (["-q"], -1), (["-vv"], 2)):
        assert runner.invoke(probe, args).exit_code == 0
        assert seen.pop() == level


def test_cli_never_writes_through_a_symlink(probed: list[NodeLinks], tmp_path: Path) -> None:
    # issue 41: `init -o LINK --yes` wrote the inventory into whatever LINK pointed at
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    link = tmp_path / "inv.yml"
    link.symlink_to(target)
    result = CliRunner().invoke(cli, ["init", "10.0.0.11", "10.0.0.12", "-o", str(link), "--yes"])
    assert result.exit_code == 2 and "symbolic link" in result.output, result.output
    assert target.read_text() == "keep me\n" and link.is_symlink()


def test_overwriting_an_existing_inventory_defaults_to_no(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 41: the question defaulted to yes, so Enter overwrote hours of edits
    import io

    from orchestrator.cli import init

    asked: list[tuple[str, bool]] = []

    def confirm(text: str, default: bool, err: bool) -> bool:
        asked.append((text, default))
        return default  # the user pressed Enter

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(init.sys, "stdin", Terminal())
    monkeypatch.setattr(init.click, "confirm", confirm)
    out = tmp_path / "inv.yml"
    out.write_text("mine\n")
    assert init._write(out, "new\n", yes=False) is False
    assert asked == [(f"Overwrite {out}?", False)] and out.read_text() == "mine\n"
    fresh = tmp_path / "fresh.yml"
    assert init._write(fresh, "new\n", yes=False) is True and fresh.read_text() == "new\n"
    assert asked[-1] == (f"Write {fresh}?", True)
