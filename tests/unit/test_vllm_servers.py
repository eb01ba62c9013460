"""vLLM servers, named and placed (issue 24): each its own containers, ports and record; judged
against every node's servers; the migration from the single-server layout (a server an earlier
sparkctl launched: RUN_DIR/server.json on the head, container sparkctl-vllm, vllm.pid) seen by
status, stopped by `down --server`, taken over by a relaunch of its recipe."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeTransport, cluster_of
from conftest import make_context as context
from conftest import make_inventory as inventory
from nodescript import run_node_script

from orchestrator.core.step import Change, Unchanged
from orchestrator.engines import load_recipe, servers
from orchestrator.engines.vllm import ENGINE, check, serve
from orchestrator.engines.vllm.ports import RayPorts, ServerPorts
from orchestrator.errors import InputError, SparkctlError
from orchestrator.paths import RUN_DIR, SERVER_JSON
from orchestrator.recipe import LaunchOptions
from orchestrator.records import Server, read_server

LEGACY = {"name": "gpt-oss-120b-vllm", "engine": "vllm", "recipe": "gpt-oss-120b-vllm",
          "model": "openai/gpt-oss-120b", "port": 8000, "nodes": ["spark-a"],
          "container": "sparkctl-vllm", "main": "vllm.pid", "ours": ["vllm"], "config_hash": "old",
          "started": "2026-11-20T10:00:00+00:00", "memory_gb": 110.0}


def spec(recipe: str = "gpt-oss-120b-vllm", nodes: list[str] | None = None,
         port: int | None = None, **options: Any) -> serve.ServeSpec:
    """The server `launch RECIPE [--nodes] [--port] [--name ...]` makes on the test inventory."""
    update = {k: v for k, v in (("placement", nodes), ("port", port)) if v is not None}
    return serve.ServeSpec(load_recipe(recipe).model_copy(update=update), inventory(),
                           LaunchOptions(**options))


def facts(a: list[dict[str, Any]], b: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    def answer(found: list[dict[str, Any]]) -> dict[str, Any]:
        return {"commands": {"servers": {"rc": 0, "out": json.dumps({"servers": found})}}}
    return {"spark-a": answer(a), "spark-b": answer(b or [])}


def judged(s: serve.ServeSpec, found: dict[str, Any]) -> Any:
    return check.Placement(s).check(context(inventory(), "spark-a", found))


# ------------------------------------------------------------------ names, nodes, ports
def test_each_server_has_its_containers_nodes_and_ports() -> None:
    default = spec()
    placed = spec(nodes=["spark-b"], port=8001, name="b")
    assert (default.name, default.container, default.nodes) == (
        "gpt-oss-120b-vllm", "sparkctl-vllm-gpt-oss-120b-vllm", ["spark-a"])
    assert (placed.name, placed.container, placed.nodes, placed.first) == (
        "b", "sparkctl-vllm-b", ["spark-b"], "spark-b")
    assert placed.directory == f"{RUN_DIR}/servers/b/serve"
    # the API port moves the others: two servers on one node never share a Ray port
    assert default.ports == ServerPorts(8000, 6379, 25000, 29501, RayPorts(
        21000, 22000, 23000, 24000, 25000, 26000, (10002, 10051)))
    assert placed.ports == ServerPorts(8001, 6380, 25001, 29502, RayPorts(
        21001, 22001, 23001, 24001, 25001, 26001, (10052, 10101)))
    # the worker ports: 50 a server, in slots of Ray's own default range 10002-19999
    last = ServerPorts.of(load_recipe("gpt-oss-120b-vllm").model_copy(update={"port": 8198}))
    assert last.ray_node.workers == (19902, 19951)
    assert ServerPorts.of(load_recipe("gpt-oss-120b-vllm").model_copy(
        update={"port": 8199})).ray_node.workers == (10002, 10051)
    assert ServerPorts.of(load_recipe("gpt-oss-120b-vllm").model_copy(update={"port": 65535})
                          ).ray == 6379 + 535
    wrapped = load_recipe("gpt-oss-120b-vllm")
    wrapped = wrapped.model_copy(update={"ray": wrapped.ray.model_copy(update={"port": 65500}),
                                         "port": 8100})
    assert ServerPorts.of(wrapped).ray == 1024 + (65500 + 100 - 1024) % (65535 - 1024 + 1)
    assert placed.wanted().ports == placed.ports.bound(placed.backend, 1)
    assert placed.digest != spec().digest  # the name is part of the configuration


def test_a_second_server_on_the_same_node_is_judged_by_its_ports_and_memory() -> None:
    first = {**spec().record(), "alive": True, "health": 200}
    # the same port on the same node: refused, naming the server that holds it
    with pytest.raises(SparkctlError, match=r"port 8000 on spark-a is taken by server "
                                            r"gpt-oss-120b-vllm \(vllm"):
        judged(spec("minimax-m2.7"), facts([first]))
    # another port, but both need most of the node's memory: refused with the numbers (exit 2)
    with pytest.raises(InputError, match=r"spark-a: .* GB \(gpt-oss-120b-vllm\) already running"):
        judged(spec(port=8001, name="two"), facts([first]))
    fits = judged(spec(port=8001, name="two", ignore_memory=True), facts([first]))
    assert isinstance(fits, Unchanged) and "1 other server(s) running" in fits.reason
    # every port a record lists is taken like its API port (engines/servers.py ports_of)
    ray_port = {**first, "port": 9999, "listen_ports": [9999, 6380, 8001]}
    with pytest.raises(SparkctlError, match=r"port 8001 on spark-a is taken by server"):
        judged(spec(port=8001, name="two", ignore_memory=True), facts([ray_port]))
    # on the other node: nothing in the way
    assert isinstance(judged(spec(nodes=["spark-b"], name="b"), facts([first])), Unchanged)


def ray_spec(port: int, name: str, nodes: list[str] | None = None) -> serve.ServeSpec:
    """A one-node server over Ray (the test recipe's image picks mp by itself)."""
    recipe = load_recipe("gpt-oss-120b-vllm").model_copy(
        update={"executor": "ray", "port": port, "placement": nodes})
    return serve.ServeSpec(recipe, inventory(), LaunchOptions(name=name, ignore_memory=True))


def test_api_ports_199_apart_get_their_own_ray_worker_slots_on_a_shared_node() -> None:
    first = ray_spec(8000, "one")
    running = {**first.record(), "alive": True, "health": 200}
    assert first.backend == "ray" and first.ports.ray_node.workers == (10002, 10051)
    # 8199's own slot (199 % 199 = 0) is 8000's: it takes the next free one
    second = ray_spec(8199, "two")
    assert second.ports.ray_node.workers == (10002, 10051)
    assert isinstance(judged(second, facts([running])), Unchanged)
    assert second.ports.ray_node.workers == (10052, 10101)
    assert second.record()["listen_ports"] == second.ports.bound("ray", 1)
    assert not set(second.ports.ray_ports()) & set(first.ports.ray_ports())
    # the boot unit's port guard closes the range it moved to (built after the placement step)
    from orchestrator.engines.vllm.persist import persist_phase

    unit = next(step for step in persist_phase(second, LaunchOptions(persist=True)).steps
                if hasattr(step, "spec"))
    assert '[[10052, 10101]]' in unit.spec.part(inventory().node("spark-a")).first[0][1]
    # on a node the first does not use: its own slot
    elsewhere = ray_spec(8199, "two", ["spark-b"])
    judged(elsewhere, facts([running]))
    assert elsewhere.ports.ray_node.workers == (10002, 10051)
    # running again, it keeps the slot its record lists (its guard and Ray stay as they are)
    both = [running, {**second.record(), "alive": True, "health": 200}]
    again = ray_spec(8199, "two")
    assert isinstance(judged(again, facts(both)), Unchanged)
    assert again.ports.ray_node.workers == (10052, 10101)
    # mp has no Ray workers: nothing moves
    mp = spec(port=8199, name="mp", ignore_memory=True)
    judged(mp, facts([running]))
    assert mp.backend == "mp" and mp.ports.ray_node.workers == (10002, 10051)


def test_no_free_worker_slot_is_refused_naming_the_nodes_and_the_way_out() -> None:
    full = [{**ray_spec(8000 + slot, f"s{slot}").record(), "alive": True, "health": 200,
             "memory_gb": 0.1} for slot in range(199)]
    with pytest.raises(InputError, match=r"^spark-a: every one of Ray's 199 worker port slots "
                                         r"\(50 ports each, 10002-19951\) is held by another "
                                         r"server .*`sparkctl down --server NAME`.*executor: mp"):
        judged(ray_spec(8500, "late"), facts(full))


def test_the_same_name_runs_the_same_configuration_or_is_refused_or_replaced() -> None:
    s = spec()
    same = {**s.record(), "alive": True, "health": 200}
    here = judged(s, facts([same]))
    assert isinstance(here, Unchanged) and "already runs on spark-a" in here.reason
    other = {**same, "config_hash": "x"}
    with pytest.raises(SparkctlError, match=r"already runs .* with another configuration: pass "
                                            r"--replace"):
        judged(s, facts([other]))
    replaced = judged(spec(replace=True), facts([other]))
    assert isinstance(replaced, Change) and replaced.summary.endswith("--replace")
    # dead (a container or vllm serve ended): all of it stopped, then started whole
    dead = judged(s, facts([{**same, "alive": False}]))
    assert isinstance(dead, Change)
    assert dead.summary == "restart gpt-oss-120b-vllm: dead (vllm serve or its container ended)"
    # its part on another node gone (node/servers.py's members there): dead, named
    spans = {**same, "nodes": ["spark-a", "spark-b"]}
    worker = judged(s, {node: {"commands": {"servers": {"rc": 0, "out": json.dumps(answer)}}}
                        for node, answer in (
                            ("spark-a", {"servers": [spans], "members": {s.name: {"running": True}}}),
                            ("spark-b", {"servers": [], "members": {}}))})
    assert worker.summary.endswith("dead (its container ended on spark-b)")  # type: ignore[union-attr]
    # another configuration that died: nothing to keep, started as any new one
    gone = judged(s, facts([{**same, "alive": False, "config_hash": "x"}]))
    assert isinstance(gone, Unchanged) and "fits on spark-a" in gone.reason


# ------------------------------------------------------------------ the single-server layout
def migrated(**more: Any) -> dict[str, Any]:
    """LEGACY as node/servers.py lists it after the one-time migration (alive, answering)."""
    record = {k: v for k, v in LEGACY.items() if k != "main"}
    return {**record, "migrated_from": SERVER_JSON, "alive": True, "health": 200, **more}


def test_a_legacy_server_of_the_same_recipe_is_replaced_by_the_named_one_saying_so() -> None:
    s = spec()
    legacy = migrated()
    change = judged(s, facts([legacy]))
    assert isinstance(change, Change)
    assert change.summary == (
        "replace gpt-oss-120b-vllm, launched by an earlier sparkctl as the cluster's one vLLM server "
        f"(container sparkctl-vllm on spark-a, record {SERVER_JSON}): stop it and start it as a "
        f"named server (sparkctl-vllm-gpt-oss-120b-vllm on spark-a, record {RUN_DIR}/servers/"
        "gpt-oss-120b-vllm/server.json)")
    transports = {n: FakeTransport(n, [(0, "", "")] * 2) for n in ("spark-a", "spark-b")}
    ctx = context(inventory(), "spark-a", facts([legacy]), transports=transports)
    assert check.Placement(s).apply(ctx, change) == (
        "stopped the earlier single vLLM server gpt-oss-120b-vllm")
    call, guard = transports["spark-a"].calls  # on its node only
    # the earlier guard's pid file goes: the new server's guard must start
    assert guard.command == f"rm -f {RUN_DIR}/servers/gpt-oss-120b-vllm/memguard.pid"
    assert "name=^/sparkctl-vllm$" in call.command and "label=sparkctl.managed=true" in call.command
    # its directory (the record, its moved pid file) goes with it: status no longer judges it
    assert call.command.endswith(f"rm -rf -- {RUN_DIR}/servers/gpt-oss-120b-vllm")
    assert not transports["spark-b"].calls
    # a dead one is cleaned up the same way (its containers and pid file)
    assert isinstance(judged(s, facts([{**legacy, "alive": False}])), Change)


def test_a_legacy_server_of_another_recipe_is_another_server() -> None:
    legacy = migrated()
    assert isinstance(judged(spec(nodes=["spark-b"], name="b"), facts([legacy])), Unchanged)
    with pytest.raises(SparkctlError, match="port 8000 on spark-a is taken by server x "):
        judged(spec("minimax-m2.7"), facts([{**legacy, "name": "x", "recipe": "x"}]))


def test_the_legacy_layout_is_migrated_listed_for_status_and_stopped_by_down_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """node/servers.py on a head an earlier sparkctl launched vLLM on: its record converted once
    (its own directory, its pid file moved along), listed (engine vllm, legacy in status),
    judged by status, and `down --server` stops exactly its containers."""
    from orchestrator.status.server import server_list

    tmp_path.joinpath("server.json").write_text(json.dumps({
        k: v for k, v in LEGACY.items() if k != "memory_gb"}))
    tmp_path.joinpath("vllm.pid").write_text("4242\n")
    migrate = {"container": "trtllm-multinode", "engine": "trtllm", "ours": ["mpirun"],
               "nodes": ["spark-a", "spark-b"]}
    args = {"run": str(tmp_path), "probe": True, "migrate": migrate, "ready_lines": {}}
    ran = run_node_script("servers.py", [json.dumps(args)], monkeypatch, replace={
        "def running(container):": "def running(container):\n    return container == "
                                   "'sparkctl-vllm'\n\ndef _unused(container):",
        "def health(record):": "def health(record):\n    return 200\n\ndef _unused2(record):",
        "def members():": "def members():\n    return {}\n\ndef _unused3():"})
    (found,) = ran.json["servers"]
    assert (found["engine"], found["container"], found["alive"], "main" in found) == (
        "vllm", "sparkctl-vllm", True, False)  # alive while its container runs, as before
    directory = tmp_path / "servers" / "gpt-oss-120b-vllm"
    assert not tmp_path.joinpath("server.json").exists()
    assert sorted(p.name for p in directory.iterdir()) == ["server.json", "vllm.pid"]
    answer = {"commands": {"servers": {"rc": 0, "out": ran.stdout}}}
    listed = server_list(inventory(), cluster_of({"spark-a": answer}))
    assert [(s["name"], s["engine"], s["state"], s["legacy"]) for s in listed] == [
        ("gpt-oss-120b-vllm", "vllm", "healthy", True)]

    step = servers.StopNamed("gpt-oss-120b-vllm")
    change = step.check(context(inventory(), "spark-a", {"spark-a": answer, "spark-b": {}}))
    assert isinstance(change, Change) and change.summary.startswith("stop gpt-oss-120b-vllm (vllm")
    assert "name=^/sparkctl-vllm$" in change.commands[0]
    there = step.check(context(inventory(), "spark-b", {"spark-a": answer, "spark-b": {}}))
    assert isinstance(there, Unchanged)
    assert ENGINE.containers("") == ["sparkctl-vllm"]  # what `down` inspects besides its labels


# ------------------------------------------------------------------ liveness of vllm serve
def test_a_named_server_whose_vllm_serve_ended_is_dead_though_its_ray_container_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm serve runs by `docker exec` in a Ray container that outlives it: node/servers.py
    finds the pid file's process in the container's PID namespace."""
    record_dir = tmp_path / "servers" / "q"
    (record_dir / "serve").mkdir(parents=True)
    pid_file = record_dir / "serve" / "vllm.pid"
    record = {"name": "q", "engine": "vllm", "port": 1, "container": str(os.getpid()),
              "pid_file": str(pid_file), "nodes": ["spark-a"], "ours": ["python"]}
    (record_dir / "server.json").write_text(json.dumps(record))
    args = {"run": str(tmp_path), "probe": False, "ready_lines": {}}

    def alive() -> bool:
        ran = run_node_script("servers.py", [json.dumps(args)], monkeypatch, replace={
            "def running(container):": "def running(container):\n    return True\n\n"
                                       "def _unused(container):",
            '["docker", "inspect", "-f", "{{.State.Pid}}", record.container]':
                '["echo", record.container]',
            "def members():": "def members():\n    return {}\n\ndef _unused3():"})
        return bool(ran.json["servers"][0]["alive"])

    pid_file.write_text(f"{os.getpid()}\n")  # (in one PID namespace: the same number)
    assert alive()
    # the same number, another process (a restarted container numbers from 1 again): not it
    record["ours"] = ["vllm serve"]
    (record_dir / "server.json").write_text(json.dumps(record))
    assert not alive()
    pid_file.write_text("999999999\n")
    assert not alive()
    pid_file.unlink()
    assert not alive()


def test_logs_of_a_server_include_the_files_beside_its_record() -> None:
    from orchestrator.status.logs import sources_for

    inv = inventory()
    containers, files = sources_for(inv, inv.node("spark-a"), False, None, 20, server="q")
    assert "label=sparkctl.server=q" in containers.command
    assert f"{RUN_DIR}/servers/q/*/*.log" in files.command and "tail -v -n 20" in files.command


def test_a_named_vllm_server_that_logged_its_ready_line_and_answers_no_more_is_stalled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ready_at in its record (its boot unit started it after a reboot): the ready line in
    vllm serve's own log, beside its pid file, tells stalled from loading."""
    from orchestrator.engines import ready_lines
    from orchestrator.status.server import server_state

    serve_dir = tmp_path / "servers" / "q" / "serve"
    serve_dir.mkdir(parents=True)
    record = {"name": "q", "engine": "vllm", "port": 1, "container": "c",
              "pid_file": str(serve_dir / "vllm.pid"), "nodes": ["spark-a"]}
    (serve_dir.parent / "server.json").write_text(json.dumps(record))
    args = {"run": str(tmp_path), "probe": True, "ready_lines": ready_lines()}

    def listed() -> Server:
        ran = run_node_script("servers.py", [json.dumps(args)], monkeypatch, replace={
            "def running(container):": "def running(container):\n    return True\n\n"
                                       "def _unused(container):",
            "def main_alive(record):": "def main_alive(record):\n    return True\n\n"
                                       "def _unused4(record):",
            "def health(record):": "def health(record):\n    return 503\n\ndef _unused2(record):",
            "def members():": "def members():\n    return {}\n\ndef _unused3():"})
        return read_server(ran.json["servers"][0], "spark-a")

    (serve_dir / "server.log").write_text("Loading weights\n")
    assert listed().ready_log is False and server_state(listed()) == "loading"
    (serve_dir / "server.log").write_text("Loading weights\nINFO:     Application startup complete.\n")
    assert listed().ready_log is True and server_state(listed()) == "stalled"



def test_a_containers_memory_counts_every_process_of_its_namespace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm serve is `docker exec`'d: not a descendant of the container's first process (an mp
    head's `sleep infinity`), so status counts every process in the container's PID namespace
    and names the largest."""
    args = {"run": "/nonexistent", "probe": False, "ready_lines": {}}
    ran = run_node_script("servers.py", [json.dumps(args)], monkeypatch)
    usage = ran.namespace["namespace_usage"]
    assert usage(os.getpid()) is None  # this test's own namespace: not a container's
    inside = run_node_script("servers.py", [json.dumps(args)], monkeypatch, replace={
        'os.readlink("/proc/self/ns/pid")': '"pid:[a container]"'})
    total, largest = inside.namespace["namespace_usage"](os.getpid())
    assert total > 0 and largest  # every process here, the largest by name
    assert usage(999999999) is None  # gone
