"""The Ray port guard of a vLLM server (issue 41 item 3): the rules built for its fixed ports,
the node program against a stand-in iptables (tests/unit/fake_iptables.py), the launch step's
judgement from facts, and its removal by `down --server`, `down` and a reboot's boot unit."""

from __future__ import annotations

import itertools
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import fake_iptables
import pytest
from conftest import make_context as context
from conftest import make_inventory as inventory
from nodescript import Ran, run_node_script

from orchestrator.core.step import Change, Unchanged
from orchestrator.engines import load_recipe, servers
from orchestrator.engines.vllm import guard, persist, ray, serve
from orchestrator.errors import SparkctlError
from orchestrator.phases import port_guards
from orchestrator.recipe import LaunchOptions
from orchestrator.records import Server, ServerRecord

NAME = "minimax-m2.7"
CHAIN = f"sparkctl-ray-{NAME}"


def spec(**update: Any) -> serve.ServeSpec:
    recipe = load_recipe(NAME).model_copy(update=update)
    return serve.ServeSpec(recipe, inventory(), LaunchOptions())


@pytest.fixture
def tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in iptables first on PATH; returns its state file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_iptables.install(str(bin_dir))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_IPTABLES_STATE", str(tmp_path / "tables.json"))
    monkeypatch.setenv("FAKE_RUNNING", f"sparkctl-vllm-{NAME}")
    return tmp_path / "tables.json"


def node_guard(mode: str, config: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Ran:
    return run_node_script("portguard.py", [mode, json.dumps(config)], monkeypatch)


def rules(state: Path, tool: str = "iptables") -> dict[str, list[str]]:
    return dict(json.loads(state.read_text())[tool])


# ------------------------------------------------------------------ the ports and the rules
def test_every_ray_port_is_fixed_and_given_to_ray_start() -> None:
    s = spec()
    head, worker = (ray.ray_args(s, s.inventory.node(n)) for n in s.nodes)
    for args in (head, worker):
        for flag, value in (("--node-manager-port", "21000"), ("--object-manager-port", "22000"),
                            ("--runtime-env-agent-port", "23000"),
                            ("--dashboard-agent-grpc-port", "24000"),
                            ("--dashboard-agent-listen-port", "25000"),
                            ("--metrics-export-port", "26000"), ("--min-worker-port", "10002"),
                            ("--max-worker-port", "10051")):
            assert args[args.index(flag) + 1] == value, (flag, args)
    assert head[head.index("--port") + 1] == "6379" and "--include-dashboard=false" in head
    config = guard.guard_config(s)
    # every port Ray is given is one the guard closes
    given = {int(value) for flag, value in itertools.pairwise(head)
             if flag.endswith("-port") and value.isdigit()}
    assert len(given) == 9
    closed = set(config["ports"]) | {p for low, high in config["ranges"]
                                     for p in range(low, high + 1)}
    assert given <= closed and 8000 not in closed  # the API port is --host's business
    assert 10001 in closed  # Ray's client server, where the image's Ray starts it
    assert config["interfaces"] == ["enp1s0f1np1", "enP2p1s0f1np1"]


RAY = Path("/var/lib/sparklab/cache/ray/root-2.60.0/usr/lib/sparklab/ray")


@pytest.mark.skipif(not (RAY / "bin" / "ray").exists(), reason="the lab's Ray 2.60 is not installed")
def test_the_options_are_ray_2_60s_own() -> None:
    """Every option sparkctl gives `ray start` is in the real Ray's `ray start --help` (the
    pinned version the lab installs), so a renamed option fails here, not on a Spark."""
    site = next((RAY / "lib").glob("python3*/site-packages"))
    code = "import sys; sys.argv = ['ray', 'start', '--help']\nfrom ray.scripts.scripts import main; main()"
    helped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    known = {word.split("=")[0] for word in helped.stdout.split() if word.startswith("--")}
    assert "--node-manager-port" in known, helped.stdout + helped.stderr
    s = spec()
    for node in s.nodes:
        used = {a.split("=")[0] for a in ray.ray_args(s, s.inventory.node(node)) if a.startswith("--")}
        assert used <= known, used - known


def test_a_long_or_odd_server_name_still_makes_a_valid_chain_name() -> None:
    assert guard.chain_name("minimax-m2.7") == CHAIN
    for name in ("a-very-long-server-name-indeed", "x" * 64, "two words"):
        chain = guard.chain_name(name)
        assert len(chain) <= guard.CHAIN_MAX and chain.startswith(guard.PREFIX), chain
        assert " " not in chain
    assert guard.chain_name("x" * 64) != guard.chain_name("x" * 63)  # a digest keeps them apart


# ------------------------------------------------------------------ the node program
def test_install_is_atomic_idempotent_and_refuses_beyond_the_fabric(
        tables: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = guard.guard_config(spec())
    assert node_guard("state", config, monkeypatch).json == {"current": False, "ranges": [],
                                                            "leftovers": []}
    first = node_guard("install", config, monkeypatch)
    assert first.code == 0 and first.json == {"changed": True, "removed": []}
    for tool in ("iptables", "ip6tables"):
        table = rules(tables, tool)
        assert table["INPUT"] == [f'-A INPUT -p tcp -m comment --comment "sparkctl port guard for '
                                  f'sparkctl-vllm-{NAME}" -j {CHAIN}']
        assert table[CHAIN] == [
            f"-A {CHAIN} -i lo -j RETURN", f"-A {CHAIN} -i enp1s0f1np1 -j RETURN",
            f"-A {CHAIN} -i enP2p1s0f1np1 -j RETURN",
            f"-A {CHAIN} -p tcp -m multiport --dports 6379,10001,21000,22000,23000,24000,25000,26000 "
            "-j REJECT --reject-with tcp-reset",
            f"-A {CHAIN} -p tcp -m tcp --dport 10002:10051 -j REJECT --reject-with tcp-reset"]
    assert node_guard("state", config, monkeypatch).json["current"] is True
    assert node_guard("install", config, monkeypatch).json["changed"] is False  # idempotent
    # asked without the worker range (launch's facts: the placement step picks it later): the
    # rest compared, the range read back
    unknown = node_guard("state", {**config, "ranges": None}, monkeypatch).json
    assert unknown["current"] is True and unknown["ranges"] == [[10002, 10051]]
    moved_workers = {**config, "ranges": [[10052, 10101]]}
    assert node_guard("state", moved_workers, monkeypatch).json["current"] is False
    # the fabric changed: the chain is rewritten in place, still hooked once
    moved = {**config, "interfaces": ["enp1s0f1np1"]}
    assert node_guard("install", moved, monkeypatch).json["changed"] is True
    assert len(rules(tables)[CHAIN]) == 4 and len(rules(tables)["INPUT"]) == 1


def test_more_than_fifteen_ports_take_several_multiport_rules() -> None:
    namespace = run_node_script("portguard.py", ["list", "{}"], pytest.MonkeyPatch()).namespace
    built = namespace["chain_rules"]({"chain": "c", "interfaces": [], "ports": list(range(1, 18))})
    assert [r.split("--dports ")[1].split()[0] for r in built[1:]] == [
        ",".join(str(p) for p in range(1, 16)), "16,17"]


def test_a_leftover_chain_of_a_server_that_no_longer_runs_goes_at_the_next_install(
        tables: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = {**guard.guard_config(spec()), "chain": "sparkctl-ray-gone", "container": "sparkctl-vllm-gone"}
    node_guard("install", old, monkeypatch)
    config = guard.guard_config(spec())
    assert node_guard("state", config, monkeypatch).json == {"current": False, "ranges": [],
                                                            "leftovers": ["sparkctl-ray-gone"]}
    assert node_guard("install", config, monkeypatch).json["removed"] == ["sparkctl-ray-gone"]
    for tool in ("iptables", "ip6tables"):
        assert set(rules(tables, tool)) == {"INPUT", CHAIN}


def test_remove_one_or_all_leaves_no_rule(tables: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = guard.guard_config(spec())
    other = {**config, "chain": "sparkctl-ray-b", "container": "sparkctl-vllm-b"}
    monkeypatch.setenv("FAKE_RUNNING", f"sparkctl-vllm-{NAME} sparkctl-vllm-b")
    node_guard("install", config, monkeypatch)
    node_guard("install", other, monkeypatch)
    assert node_guard("list", {}, monkeypatch).json == {"chains": ["sparkctl-ray-b", CHAIN]}
    assert node_guard("remove", {"chain": CHAIN}, monkeypatch).json == {"removed": [CHAIN]}
    assert set(rules(tables)) == {"INPUT", "sparkctl-ray-b"}
    assert node_guard("remove", {"chain": CHAIN}, monkeypatch).json == {"removed": []}
    assert node_guard("remove", {"all": True}, monkeypatch).json == {"removed": ["sparkctl-ray-b"]}
    for tool in ("iptables", "ip6tables"):
        assert rules(tables, tool) == {"INPUT": []}


def test_without_iptables_install_refuses_and_remove_has_nothing_to_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there; the program adds only sbin dirs
    replace = {':/usr/local/sbin:/usr/sbin:/sbin"': '"'}  # (this machine's own iptables)
    config = json.dumps(guard.guard_config(spec()))
    ran = run_node_script("portguard.py", ["install", config], monkeypatch, replace)
    assert ran.code == 3 and ran.json == {"missing": ["iptables", "ip6tables"]}
    ran = run_node_script("portguard.py", ["remove", '{"all": true}'], monkeypatch, replace)
    assert ran.code == 0 and ran.json == {"missing": ["iptables", "ip6tables"]}


# ------------------------------------------------------------------ the launch step
def guard_ctx(answer: dict[str, Any], node: str = "spark-a") -> Any:
    facts = {"commands": {"portguard": answer}}
    return context(inventory(), node, {"spark-a": facts, "spark-b": facts})


def test_the_step_installs_keeps_and_cleans_from_the_nodes_answer() -> None:
    step = guard.GuardRayPorts(spec())
    fresh = step.check(guard_ctx({"rc": 0, "out": '{"current": false, "leftovers": []}'}))
    assert isinstance(fresh, Change) and CHAIN in fresh.summary
    assert "6379,10001,21000,22000,23000,24000,25000,26000,10002-10051" in fresh.summary
    assert "enp1s0f1np1, enP2p1s0f1np1" in fresh.summary
    argv = shlex.split(fresh.commands[0])
    assert argv[:2] == ["python3", "-c"] and argv[3] == "install"
    assert json.loads(argv[4]) == guard.guard_config(spec())
    kept = step.check(guard_ctx({"rc": 0, "out": '{"current": true, "ranges": [[10002, 10051]], '
                                                 '"leftovers": []}'}))
    assert isinstance(kept, Unchanged)
    # the rest as wanted but another worker range closed (the placement step moved its slot)
    moved = step.check(guard_ctx({"rc": 0, "out": '{"current": true, "ranges": [[10052, 10101]], '
                                                  '"leftovers": []}'}))
    assert isinstance(moved, Change) and "10002-10051" in moved.summary
    left = step.check(guard_ctx({"rc": 0, "out": '{"current": true, "ranges": [[10002, 10051]], '
                                                 '"leftovers": ["sparkctl-ray-x"]}'}))
    assert isinstance(left, Change) and left.summary == "remove sparkctl-ray-x (its server no longer runs)"
    other = guard.GuardRayPorts(spec(placement=["spark-b"]))
    assert isinstance(other.check(guard_ctx({}, "spark-a")), Unchanged)


def test_a_node_without_iptables_is_refused_by_name_before_anything_changes() -> None:
    step = guard.GuardRayPorts(spec())
    with pytest.raises(SparkctlError) as found:
        step.check(guard_ctx({"rc": 3, "out": '{"missing": ["iptables", "ip6tables"]}'}, "spark-b"))
    text = str(found.value)
    assert text.startswith("spark-b: iptables and ip6tables not found")
    assert "apt-get install iptables" in text and "executor: mp" in text


def test_the_step_applies_and_says_what_it_removed(fake_transport: Any) -> None:
    node = fake_transport("spark-a").on(r"portguard|install", answer={
        "changed": True, "removed": ["sparkctl-ray-old"]})
    ctx = context(inventory(), "spark-a", {"spark-a": {}}, transports={"spark-a": node})
    ctx.transport = node
    step = guard.GuardRayPorts(spec())
    change = Change("x", commands=(port_guards.guard_cmd("install", guard.guard_config(spec())),))
    said = step.apply(ctx, change)
    assert said == ("Ray's ports answer on lo and the fabric only; removed sparkctl-ray-old "
                    "(no longer running)")
    assert node.calls[0].sudo


# ------------------------------------------------------------------ removal
def test_down_server_removes_the_chain_on_every_node_of_the_server() -> None:
    record = spec().record()
    assert record["port_guard"] == CHAIN
    commands = servers.stop_commands(Server(ServerRecord.from_dict(record), "spark-a"), inventory())
    assert set(commands) == {"spark-a", "spark-b"}
    for command in commands.values():
        assert command.endswith(f"&& {port_guards.remove_cmd(CHAIN)} >/dev/null")
    # mp: no Ray, no guard
    assert spec(executor="mp").record()["port_guard"] is None
    mp = Server(ServerRecord.from_dict(spec(executor="mp").record()), "spark-a")
    assert "portguard" not in "".join(servers.stop_commands(mp, inventory()).values())


def test_down_removes_every_chain_and_verifies_none_is_left(
        tables: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context(inventory(), "spark-a", {"spark-a": {"commands": {
        port_guards.FACT: {"rc": 0, "out": json.dumps({"chains": [CHAIN]})}}}})
    change = port_guards.RemovePortGuards().check(ctx)
    assert isinstance(change, Change) and CHAIN in change.summary
    assert change.commands == (port_guards.remove_cmd(),)
    for answer in ('{"chains": []}', '{"missing": ["iptables"]}'):
        ctx = context(inventory(), "spark-a", {"spark-a": {"commands": {
            port_guards.FACT: {"rc": 0, "out": answer}}}})
        assert isinstance(port_guards.RemovePortGuards().check(ctx), Unchanged)
    # down's verify names a chain still there, in either table
    node_guard("install", guard.guard_config(spec()), monkeypatch)
    left = subprocess.run(["sh", "-c", port_guards.verify_line()], capture_output=True, text=True,
                          check=False).stdout.splitlines()
    assert left == [f"firewall chain (iptables): {CHAIN}", f"firewall chain (ip6tables): {CHAIN}"]
    node_guard("remove", {"all": True}, monkeypatch)
    assert subprocess.run(["sh", "-c", port_guards.verify_line()], capture_output=True, text=True,
                          check=False).stdout == ""


def test_a_reboot_puts_the_guard_back_first_or_stops_the_container(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.phases.persist import boot_plan

    built: list[Any] = []  # the PersistSpec persist_phase builds: each node's part is in it
    monkeypatch.setattr(persist.persist, "phase", built.append)
    s = spec()
    persist.persist_phase(s, LaunchOptions(persist=True))
    persist.persist_phase(spec(executor="mp"), LaunchOptions(persist=True))
    for node in s.nodes:
        (first,) = boot_plan(built[0], s.inventory.node(node), "/hf")["first"]
        assert CHAIN in first["what"]
        assert first["cmd"].startswith("python3 -c ") and " install " in first["cmd"]
        assert first["cmd"].endswith(f"|| {{ docker stop sparkctl-vllm-{NAME}; exit 1; }}")
    assert built[1].part(s.inventory.node("spark-b")).first == []  # mp: no Ray, no guard


def test_the_boot_unit_runs_the_first_commands_before_anything_and_stops_on_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = {"server": "s", "engine": "vllm", "node": "spark-a", "role": "head", "nodes": ["spark-a"],
            "log": str(tmp_path / "boot.log"), "deadline_seconds": 5, "watch": True,
            "first": [{"what": "the guard", "cmd": "echo no iptables; exit 1"}],
            "fabric": [{"interface": "never", "address": "10.0.0.1/24"}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    ran = run_node_script("boot.py", [str(tmp_path / "plan.json")], monkeypatch)
    log = (tmp_path / "boot.log").read_text()
    assert ran.code == 1 and "FAILED: the guard: exit 1: no iptables" in log
    assert "fabric" not in log and "watching" not in log  # nothing brought up, nothing watched
