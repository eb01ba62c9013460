"""TensorRT-LLM servers are named and placed like every other engine's (engines/trtllm/steps.py),
and a server launched by the previous version (RUN_DIR/server.json, pid files directly in
RUN_DIR) is converted once into its own directory (node/servers.py's migration), then stopped
and replaced cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import cluster_of
from nodescript import run_node_script
from test_node_running import FAKE_DOCKER
from test_serve import INVENTORY, ctx

from orchestrator.core.step import Change, Unchanged
from orchestrator.engines import DEFAULT_ENGINE, load_recipe, ready_lines, servers
from orchestrator.engines.trtllm.serve import OURS, LaunchSpec
from orchestrator.engines.trtllm.steps import Placement
from orchestrator.errors import InputError, SparkctlError
from orchestrator.node import script
from orchestrator.paths import RUN_DIR, SERVER_JSON
from orchestrator.recipe import LaunchOptions
from orchestrator.records import read_server

GPT = load_recipe("gpt-oss-120b")
LLAMA = load_recipe("llama-3.3-70b")


def spec(recipe: Any, nodes: list[str], **options: Any) -> LaunchSpec:
    return LaunchSpec(recipe.model_copy(update={"placement": nodes}), INVENTORY,
                      LaunchOptions(**options))


def listing(*servers_here: dict[str, Any]) -> dict[str, Any]:
    """A node's node/servers.py answer: its records, and each live one's processes here."""
    members = {s["name"]: {"running": True} for s in servers_here
               if s.get("alive") and not s.get("migrated_from")}
    out = json.dumps({"servers": list(servers_here), "members": members})
    return {"commands": {"servers": {"rc": 0, "out": out, "err": ""}}}


def named(name: str, nodes: list[str], port: int, memory_gb: float = 100.0,
          **more: Any) -> dict[str, Any]:
    return {"name": name, "engine": "trtllm", "model": "m", "nodes": nodes, "port": port,
            "memory_gb": memory_gb, "config_hash": "h", "alive": True,
            "main": "mpirun.pid", "container": "trtllm-multinode", **more}


MIGRATED = {"recipe": "gpt-oss-120b", "model": "openai/gpt-oss-120b", "port": 8000, "tp_size": 1,
            "config_hash": "old", "engine": "trtllm", "container": "trtllm-multinode",
            "name": "gpt-oss-120b", "nodes": ["spark-a"], "main": "mpirun.pid",
            "ours": list(OURS), "migrated_from": SERVER_JSON, "alive": True, "health": 200}
"""The previous version's record as node/servers.py's migration left it (listed, alive)."""


def test_two_servers_on_their_own_nodes_fit_and_one_node_cannot_hold_both() -> None:
    facts = {"spark-a": listing(named("gpt-oss-120b", ["spark-a"], 8000)), "spark-b": listing()}
    second = spec(LLAMA, ["spark-b"])
    outcome = Placement(second).check(ctx("spark-a", facts))
    assert isinstance(outcome, Unchanged) and "1 other server(s) running" in outcome.reason
    with pytest.raises(SparkctlError, match="port 8000 on spark-a is taken by server gpt-oss-120b"):
        Placement(spec(LLAMA, ["spark-a"])).check(ctx("spark-a", facts))
    with pytest.raises(InputError, match=r"spark-a: 100.0 GB \(gpt-oss-120b\) already running"):
        Placement(spec(LLAMA, ["spark-a"], name="l2")).check(ctx("spark-a", {
            **facts, "spark-a": listing(named("gpt-oss-120b", ["spark-a"], 9000))}))


def test_the_same_name_with_another_configuration_is_refused_and_replaced_with_replace() -> None:
    facts = {"spark-a": listing(named("gpt-oss-120b", ["spark-a"], 8000)), "spark-b": listing()}
    with pytest.raises(SparkctlError, match="a server named gpt-oss-120b already runs"):
        Placement(spec(GPT, ["spark-b"])).check(ctx("spark-a", facts))
    moved = Placement(spec(GPT, ["spark-b"], replace=True)).check(ctx("spark-a", facts))
    assert isinstance(moved, Change) and moved.summary.startswith("stop server gpt-oss-120b")
    # stopped where it ran (its processes in the `up` container, by its own pid files)
    stop = servers.stop_commands(moved.payload, INVENTORY)
    assert list(stop) == ["spark-a"]
    assert f"{RUN_DIR}/servers/gpt-oss-120b" in stop["spark-a"] and '"stop"' in stop["spark-a"]
    # a dead one on another node: its leftovers go, not a second record of that name
    facts["spark-a"] = listing(named("gpt-oss-120b", ["spark-a"], 8000, alive=False))
    gone = Placement(spec(GPT, ["spark-b"])).check(ctx("spark-a", facts))
    assert isinstance(gone, Change) and gone.summary.startswith(
        "remove what is left of gpt-oss-120b on spark-a (not running")
    assert isinstance(Placement(spec(GPT, ["spark-a"])).check(ctx("spark-a", facts)), Unchanged)


def test_a_server_of_the_previous_version_is_stopped_and_started_again_per_server() -> None:
    """After the migration (RUN_DIR/server.json converted into its own directory, named after
    its recipe), a launch of the same recipe is one copy: stopped here, started again below."""
    old = MIGRATED
    facts = {"spark-a": listing(old), "spark-b": listing()}
    listed = servers.from_facts(cluster_of(facts), alive_only=False)
    assert [(s.name, s.nodes, s.migrated) for s in listed] == [
        ("gpt-oss-120b", ["spark-a"], True)]
    change = Placement(spec(GPT, ["spark-a"])).check(ctx("spark-a", facts))
    assert isinstance(change, Change) and "launched by an earlier sparkctl" in change.summary
    assert f"{SERVER_JSON}, moved to {RUN_DIR}/servers/gpt-oss-120b" in change.summary
    stop = servers.stop_commands(change.payload, INVENTORY)
    # its pid files moved into its directory: stopped there, and the directory goes
    assert f'"run": "{RUN_DIR}/servers/gpt-oss-120b"' in stop["spark-a"].replace('\\"', '"')
    assert stop["spark-a"].endswith(f"rm -rf -- {RUN_DIR}/servers/gpt-oss-120b")
    # even when it no longer answers: replaced cleanly, never left as a second record
    facts["spark-a"] = listing({**old, "alive": False})
    assert isinstance(Placement(spec(GPT, ["spark-a"])).check(ctx("spark-a", facts)), Change)
    # another recipe's old server on the head: judged like any other server there
    facts["spark-a"] = listing(old)
    with pytest.raises(SparkctlError, match="port 8000 on spark-a is taken by server gpt-oss-120b"):
        Placement(spec(LLAMA, ["spark-a"])).check(ctx("spark-a", facts))


# ------------------------------------------------------- node/servers.py on a real directory
@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "docker.log"
    fake = bindir / "docker"
    fake.write_text(FAKE_DOCKER.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return log


@pytest.fixture
def process() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["bash", "-c", "exec -a mpirun sleep 30"], start_new_session=True)
    for _ in range(100):  # until the exec happened (the command line names mpirun)
        if b"bash" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
            break
        time.sleep(0.02)
    yield proc
    proc.kill()
    proc.wait(5)


def node_servers(run: Path, monkeypatch: pytest.MonkeyPatch, head: bool = True) -> dict[str, Any]:
    migrate = {"container": "trtllm-multinode", "engine": DEFAULT_ENGINE, "ours": list(OURS),
               "nodes": ["spark-a", "spark-b"]}
    args = {"run": str(run), "probe": False, "ready_lines": ready_lines(),
            "migrate": migrate if head else None, "serverctl": script("serverctl.py")}
    ran = run_node_script("servers.py", [json.dumps(args)], monkeypatch)
    assert ran.code is None, ran.stderr
    return ran.json  # type: ignore[no-any-return]


def test_a_process_server_lives_while_its_main_process_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker: Path,
        process: subprocess.Popen[bytes]) -> None:
    run = tmp_path / "run"
    directory = run / "servers" / "gpt"
    directory.mkdir(parents=True)
    launch = spec(GPT, ["spark-a"], name="gpt")
    (directory / "processes.json").write_text(json.dumps({"container": "up", "ours": list(OURS)}))
    (directory / "server.json").write_text(json.dumps(launch.record()))
    (directory / "mpirun.pid").write_text(f"{process.pid}\n")
    (directory / "rank-0.pid").write_text(f"{process.pid}\n")

    found = node_servers(run, monkeypatch)
    (server,) = found["servers"]
    assert (server["name"], server["engine"], server["alive"], "migrated_from" in server) == (
        "gpt", "trtllm", True, False)
    assert found["members"]["gpt"]["running"] and "mpirun" in found["members"]["gpt"]["process"]
    assert "exec up" in docker.read_text()  # checked inside the container that runs it

    process.kill()
    process.wait(5)
    found = node_servers(run, monkeypatch)
    assert found["servers"][0]["alive"] is False
    assert found["members"]["gpt"]["running"] is False
    assert found["members"]["gpt"]["ended"][0].startswith("mpirun (pid ")


def test_a_rank_alone_on_another_node_is_a_member_without_a_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker: Path,
        process: subprocess.Popen[bytes]) -> None:
    run = tmp_path / "run"
    directory = run / "servers" / "qwen"
    directory.mkdir(parents=True)
    (directory / "processes.json").write_text(json.dumps({"container": "up", "ours": list(OURS)}))
    (directory / "rank-1.pid").write_text("999999\n")  # ended
    found = node_servers(run, monkeypatch, head=False)
    assert found["servers"] == []
    assert found["members"]["qwen"]["ended"] == ["rank-1 (pid 999999)"]
    server = read_server(named("qwen", ["spark-a", "spark-b"], 8000), "spark-a")
    (seen,) = servers.attach_members([server], {"spark-b": servers.parse(
        json.dumps(found), "spark-b").members or {}})
    assert seen.alive is False and seen.ended == ("rank-1 (pid 999999) on spark-b",)
    assert seen.dead_nodes == ("spark-b",)


def test_a_guard_stop_on_another_node_makes_the_server_guard_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker: Path) -> None:
    run = tmp_path / "run"
    directory = run / "servers" / "qwen"
    directory.mkdir(parents=True)
    (directory / "processes.json").write_text(json.dumps({"container": "up", "ours": list(OURS)}))
    (directory / "rank-1.pid").write_text("999999\n")  # ended: the guard stopped it
    guard = {"node": "spark-b", "available_gb": 3.1, "min_available_gb": 4.0}
    (directory / "memguard-stopped.json").write_text(json.dumps(guard))
    found = node_servers(run, monkeypatch, head=False)
    server = read_server(named("qwen", ["spark-a", "spark-b"], 8000), "spark-a")
    (seen,) = servers.attach_members([server], {"spark-b": servers.parse(
        json.dumps(found), "spark-b").members or {}})
    assert seen.memguard == guard and seen.alive is False


def test_the_previous_versions_record_is_migrated_once_into_its_own_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker: Path,
        process: subprocess.Popen[bytes]) -> None:
    """The one-time migration: the previous version's RUN_DIR/server.json (no name, engine or
    nodes), its pid files, log and config directly in RUN_DIR become the server's directory in
    the current format, the first time the head's servers are read; its mpirun still counts."""
    run = tmp_path / "run"
    run.mkdir()
    old = {"recipe": "gpt-oss-120b", "model": "openai/gpt-oss-120b", "port": 8000,
           "tp_size": 2, "config_hash": "previous", "host": "127.0.0.1"}
    (run / "server.json").write_text(json.dumps(old))
    (run / "mpirun.pid").write_text(f"{process.pid}\n")
    (run / "server.log").write_text("loading\n")
    (run / "extra-llm-api-config.yml").write_text("# theirs\n")
    (run / "memory.json").write_text("{}")  # not the server's: stays
    (server,) = node_servers(run, monkeypatch)["servers"]
    directory = run / "servers" / "gpt-oss-120b"
    assert not (run / "server.json").exists() and (run / "memory.json").exists()
    assert sorted(p.name for p in directory.iterdir()) == [
        "extra-llm-api-config.yml", "mpirun.pid", "processes.json", "server.json", "server.log"]
    record = json.loads((directory / "server.json").read_text())
    assert {k: record[k] for k in ("name", "engine", "nodes", "container", "main",
                                   "migrated_from")} == {
        "name": "gpt-oss-120b", "engine": DEFAULT_ENGINE, "nodes": ["spark-a", "spark-b"],
        "container": "trtllm-multinode", "main": "mpirun.pid",
        "migrated_from": str(run / "server.json")}
    assert json.loads((directory / "processes.json").read_text()) == {
        "container": "trtllm-multinode", "ours": list(OURS)}
    assert (server["name"], server["alive"]) == ("gpt-oss-120b", True)
    # typed from now on, like any record; a second read changes nothing
    assert read_server(server, "spark-a").migrated
    before = (directory / "server.json").read_text()
    (again,) = node_servers(run, monkeypatch)["servers"]
    assert (directory / "server.json").read_text() == before and again["alive"] is True


def test_a_one_server_engines_migrated_server_is_any_other_server_on_its_nodes() -> None:
    """vLLM's single server of the previous version, migrated: its port is judged like any
    server's, and stopping it removes its containers by name (they had no server label)."""
    vllm = {**MIGRATED, "engine": "vllm", "recipe": "minimax-m2.7", "name": "minimax-m2.7",
            "container": "sparkctl-vllm", "nodes": ["spark-a", "spark-b"]}
    vllm.pop("main")
    facts = {"spark-a": listing(vllm), "spark-b": listing()}
    with pytest.raises(SparkctlError, match=r"port 8000 on spark-b is taken by server minimax-m2\.7"):
        Placement(spec(GPT, ["spark-b"])).check(ctx("spark-a", facts))
    (found,) = servers.from_facts(cluster_of(facts))
    stop = servers.stop_commands(found, INVENTORY)
    assert sorted(stop) == ["spark-a", "spark-b"]
    assert "name=^/sparkctl-vllm$" in stop["spark-b"]
    assert "label=sparkctl.server=minimax-m2.7" in stop["spark-b"]


def test_the_migration_never_overwrites_a_named_servers_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker: Path) -> None:
    run = tmp_path / "run"
    named_dir = run / "servers" / "gpt-oss-120b"
    named_dir.mkdir(parents=True)
    mine = json.dumps(named("gpt-oss-120b", ["spark-a"], 8001))
    (named_dir / "server.json").write_text(mine)
    (run / "server.json").write_text(json.dumps({"recipe": "gpt-oss-120b", "port": 8000}))
    listed = node_servers(run, monkeypatch)["servers"]
    assert sorted(s["name"] for s in listed) == ["gpt-oss-120b", "gpt-oss-120b-earlier"]
    assert (named_dir / "server.json").read_text() == mine
