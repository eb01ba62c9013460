"""Issue 40: a repeated run sends each node the facts request it sent last time, over
connections opened at once, while the controller still imports and builds its plan
(core/speculate.py). The executor takes an early answer only for the very same request;
anything else is asked again, so the checks read what they always read."""

from __future__ import annotations

import stat
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import facts_request
from test_lazy_lock import head_facts, two_phases
from test_runner import Touch, touched

from orchestrator.core import runner
from orchestrator.core.speculate import Speculation
from orchestrator.core.step import Phase, Plan


@pytest.fixture
def inventory_file(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text("# the speculation keys its kept requests by this file's bytes\n")
    return path


def reachable(tmp_path: Path, **cluster: Any) -> Any:
    """The two Sparks with a key file that exists and an empty ssh_config (routes resolve)."""
    from conftest import TWO_SPARKS, make_inventory

    (tmp_path / "key").write_text("stands in for a private key\n")
    (tmp_path / "ssh_config").write_text("")
    data = {**TWO_SPARKS, "cluster": {**TWO_SPARKS["cluster"], "ssh_key": str(tmp_path / "key"),
                                      "ssh_config": str(tmp_path / "ssh_config"), **cluster}}
    return make_inventory(data)


@pytest.fixture
def up(fake_cluster: Any, state_dir: Path, inventory_file: Path, tmp_path: Path,
       monkeypatch: pytest.MonkeyPatch) -> Any:
    """One `up` as cli/up.py runs it: the speculation started before the inventory is loaded,
    confirmed once it is, before the plan is built."""
    connects: list[str] = []

    def go(done: bool, plan: Any = two_phases, **cluster_settings: Any) -> Any:
        cluster = fake_cluster(reachable(tmp_path, **cluster_settings),
                               facts={"spark-a": head_facts(done), "spark-b": head_facts(done)})

        def connect_all(*args: Any, **kwargs: Any) -> Any:
            connects.append("connect")
            return cluster.connect_all(*args, **kwargs)

        def connect_routes(routes: Any, timeout: float, sudo: Any, trust: bool = False) -> Any:
            connects.append(f"early {timeout:g} s")
            names = {route.node for route in routes}
            return cluster.connect_all(cluster.inventory, [
                n for n in cluster.inventory.nodes if n.name in names], sudo, trust)

        monkeypatch.setattr("orchestrator.remote.connect.connect_all", connect_all)
        monkeypatch.setattr("orchestrator.remote.connect.connect_routes", connect_routes)
        speculation = Speculation("up", inventory_file)
        speculation.start(trust_new_hosts=False)
        speculation.confirm(cluster.inventory)
        code = runner.execute(runner.RunRequest(
            command="up", inventory=cluster.inventory, build=lambda s: plan(), yes=True,
            speculation=speculation))
        return code, cluster, speculation
    go.connects = connects  # type: ignore[attr-defined]
    return go


def gatherings(cluster: Any, node: str) -> list[dict[str, Any]]:
    return [r for r in (facts_request(c) for c in cluster.commands(node)) if r is not None]


def test_a_first_run_keeps_its_requests_and_connects_once_as_always(up: Any) -> None:
    code, cluster, speculation = up(done=True)
    assert code == 0 and not speculation.started  # nothing kept yet: nothing early
    assert up.connects == ["connect"]
    for node in ("spark-a", "spark-b"):
        assert len(gatherings(cluster, node)) == 1
    assert stat.S_IMODE(speculation.path.stat().st_mode) == 0o600
    kept = speculation._read_kept()
    assert set(kept["requests"]) == set(kept["routes"]) == {"spark-a", "spark-b"}
    assert kept["routes"]["spark-b"]["target"]["hostname"] == "b"
    assert kept["command_timeout"] == 300.0 and kept["sudo_files"] == {}


def test_a_repeated_run_takes_the_early_answers_one_command_per_node(up: Any) -> None:
    up(done=True)
    code, cluster, speculation = up(done=True)
    assert code == 0 and speculation.started
    assert up.connects == ["connect", "early 300 s"]  # the early connections are the session's
    for node in ("spark-a", "spark-b"):
        assert len(cluster.commands(node)) == 1, cluster.commands(node)  # the early gathering
    (request,) = gatherings(cluster, "spark-a")
    assert request["lock_peek"] is True  # the same request the executor makes, lock look too
    assert touched(cluster) == []


def test_early_answers_still_drive_the_changes(up: Any) -> None:
    up(done=True)
    code, cluster, _ = up(done=False)  # the nodes changed between the runs
    assert code == 0 and set(touched(cluster)) == {"spark-a", "spark-b"}


def test_a_different_request_drops_the_early_answer_and_asks_again(up: Any) -> None:
    up(done=True)

    def other_plan() -> Plan:  # sparkctl (or the inventory) changed: another request
        return Plan("up", [Phase(name, [Touch()], lambda inv, node: {"node": node.name + "!"})
                           for name in ("p1", "p2")])

    code, cluster, speculation = up(done=True, plan=other_plan)
    assert code == 0
    for node in ("spark-a", "spark-b"):
        early, fresh = gatherings(cluster, node)
        assert early["node"] == node and fresh["node"] == node + "!"
    assert speculation._read_kept()["requests"]["spark-a"]["node"] == "spark-a!"  # next time


def test_a_node_reached_otherwise_now_is_connected_again_not_early(up: Any) -> None:
    """The kept route (port 22) is not how the node is reached now (2222: an ssh_config or
    a setting the inventory file's bytes do not show): the early connections are closed and
    the session connects as always; the new routes are kept."""
    up(done=True)
    code, _, speculation = up(done=True, ssh_port=2222)
    assert code == 0 and not speculation.started
    assert up.connects == ["connect", "early 300 s", "connect"]
    assert speculation._read_kept()["routes"]["spark-a"]["target"]["port"] == 2222


def test_another_inventory_file_has_its_own_kept_requests(up: Any, inventory_file: Path) -> None:
    up(done=True)
    inventory_file.write_text("# edited\n")
    _, cluster, speculation = up(done=True)
    assert not speculation.started and len(gatherings(cluster, "spark-a")) == 1


@pytest.fixture
def cli_cluster(fake_cluster: Any, state_dir: Path, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fake cluster behind the CLI: (cluster, inventory file, the thread of each connect)."""
    import threading

    from orchestrator.core import inventory_option

    inventory = reachable(tmp_path)
    cluster = fake_cluster(inventory)
    threads: list[str] = []

    def connect_all(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return cluster.connect_all(*args, **kwargs)

    def connect_routes(routes: Any, timeout: float, sudo: Any, trust: bool = False) -> Any:
        threads.append(threading.current_thread().name)
        return cluster.connect_all(inventory, inventory.nodes, sudo, trust)

    monkeypatch.setattr("orchestrator.remote.connect.connect_all", connect_all)
    monkeypatch.setattr("orchestrator.remote.connect.connect_routes", connect_routes)
    path = tmp_path / "two.yml"
    path.write_text("# stands in for the inventory file\n")
    monkeypatch.setattr(inventory_option, "load_inventory_option",
                        lambda option: (inventory, path))
    return cluster, path, threads


def test_the_cli_starts_the_second_run_early_and_not_for_an_implicit_inventory(
        cli_cluster: Any) -> None:
    """cli/up.py: a named inventory's repeated `plan` connects from the speculation's thread
    and sends each node one gathering; without --inventory nothing starts before the cluster
    is named (runner.check_named_cluster)."""
    from click.testing import CliRunner

    from orchestrator.cli import cli
    from orchestrator.core import inventory_option

    cluster, path, threads = cli_cluster
    for _ in range(2):
        CliRunner().invoke(cli, ["plan", "-i", str(path)], catch_exceptions=False)
    assert threads == ["MainThread", "sparkctl-speculate"]
    for node in ("spark-a", "spark-b"):
        assert len(gatherings(cluster, node)) == 2  # one per run: the early one was taken

    inventory_option.IMPLICIT[cluster.inventory.source] = "the default in the current directory"
    try:
        CliRunner().invoke(cli, ["plan"], catch_exceptions=False)
    finally:
        inventory_option.IMPLICIT.clear()
    assert threads[-1] == "MainThread"


def test_launch_starts_a_repeated_launch_early_keyed_by_its_recipe(
        cli_cluster: Any, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cli/launch.py: the same launch again connects from the speculation's thread and the
    nodes answer once; another recipe (other requests) keeps its own and starts nothing early."""
    from click.testing import CliRunner

    from orchestrator.cli import cli

    cluster, path, threads = cli_cluster
    loaded_after: list[list[str]] = []
    inventory = cluster.inventory

    def load(option: Any) -> Any:  # the second run connects before its inventory is loaded
        for _ in range(50 if len(loaded_after) == 1 else 0):
            if "sparkctl-speculate" in threads:
                break
            time.sleep(0.1)
        loaded_after.append(list(threads))
        return inventory, path

    monkeypatch.setattr("orchestrator.core.inventory_option.load_inventory_option", load)
    for recipe in ("qwen3-8b", "qwen3-8b", "gpt-oss-120b"):
        CliRunner().invoke(cli, ["launch", recipe, "--dry-run", "-i", str(path)],
                           catch_exceptions=False)
    assert threads == ["MainThread", "sparkctl-speculate", "MainThread"]
    assert loaded_after[1] == ["MainThread", "sparkctl-speculate"]  # connected before loading
    assert len(gatherings(cluster, "spark-b")) == 3  # one per run: the early one was taken
    assert len(list((state_dir / "requests").glob("launch-*.json"))) == 2
