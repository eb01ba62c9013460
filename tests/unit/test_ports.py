"""Preflight's port check (phases/ports.py, node/ports.py): every port a server binds, on every
node it binds one, is free or held by this cluster's own sparkctl containers (issue 27: a
taken port used to surface after the model had loaded, on the wrong node's step)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import make_inventory, node_facts
from nodescript import run_node_script

from orchestrator.core.step import NodeContext, RunOptions, RunState, Unchanged
from orchestrator.engines import load_recipe
from orchestrator.errors import SparkctlError
from orchestrator.phases import ports
from orchestrator.phases.ports import PortsFree
from orchestrator.recipe import ListenPort

INVENTORY = make_inventory()


def test_every_engine_declares_every_port_it_binds() -> None:
    nodes = ["spark-a", "spark-b"]
    trtllm = load_recipe("qwen3-235b")
    assert trtllm.listen_ports(nodes) == [ListenPort("spark-a", trtllm.port, "HTTP",
                                                     "launch with another --port")]
    vllm = load_recipe("minimax-m2.7")  # Ray: its head on the first node, an agent on each
    assert [(p.node, p.port, p.what) for p in vllm.listen_ports(nodes)] == [
        ("spark-a", vllm.port, "HTTP"), ("spark-a", 6379, "Ray GCS"),
        ("spark-a", 25000, "Ray dashboard agent"),
        ("spark-b", 25000, "Ray dashboard agent")]
    # another API port moves every port of the server (engines/vllm/ports.py)
    moved = vllm.model_copy(update={"port": 8001})
    assert [p.port for p in moved.listen_ports(["spark-b", "spark-a"])] == [
        8001, 6380, 25001, 25001]
    assert moved.listen_ports(["spark-b", "spark-a"])[1].node == "spark-b"
    mp = load_recipe("minimax-m2.7-mp")
    assert [(p.node, p.port, p.what) for p in mp.listen_ports(nodes)][1:] == [
        ("spark-a", 29501, "master-port")]
    one = load_recipe("qwen3-8b")
    assert [p.what for p in one.listen_ports(["spark-b"])] == ["HTTP"]  # one node: no rendezvous
    two = load_recipe("qwen3.6-27b-tp2")
    assert [(p.node, p.port, p.what, p.fix) for p in two.listen_ports(["spark-b", "spark-a"])] == [
        ("spark-b", two.port, "HTTP", "launch with another --port"),
        ("spark-b", two.dist_port, "dist-init", "set dist_port in the recipe")]


def ctx(node: str, answer: dict[str, Any] | None) -> NodeContext:
    facts = node_facts({"commands": {"ports": answer}} if answer is not None else {}, node)
    return NodeContext(INVENTORY, INVENTORY.node(node), facts, {node: facts}, None,
                       RunOptions("launch"), RunState())


WANTED = [ListenPort("spark-b", 30000, "HTTP", "launch with another --port"),
          ListenPort("spark-b", 20000, "dist-init", "set dist_port in the recipe")]


def answer(found: dict[str, Any]) -> dict[str, Any]:
    return {"rc": 0, "out": json.dumps(found), "err": ""}


def test_a_taken_port_fails_the_node_where_it_is_taken_naming_holder_and_fix() -> None:
    taken = answer({"ports": {"20000": [{"pid": 4242, "process": "python3", "address": "0.0.0.0",
                                         "ours": False, "container": None}]}})
    with pytest.raises(SparkctlError) as err:
        PortsFree(WANTED).check(ctx("spark-b", taken))
    assert str(err.value) == (
        "spark-b: port 20000 (dist-init) is taken by python3 (pid 4242) on 0.0.0.0: stop it, or "
        "set dist_port in the recipe. Nothing was started or downloaded.")
    # the other node binds nothing of this server: nothing to say there
    assert PortsFree(WANTED).check(ctx("spark-a", None)) == Unchanged("the server binds no port here")


def test_our_own_containers_listeners_are_the_launchs_business() -> None:
    ours = answer({"ports": {"30000": [{"pid": 77, "process": "python3", "address": "127.0.0.1",
                                        "ours": True, "container": "sparkctl-sglang-x"}]}})
    assert PortsFree(WANTED).check(ctx("spark-b", ours)) == Unchanged(
        "free: 30000 (HTTP), 20000 (dist-init)")
    foreign = answer({"ports": {"30000": [{"pid": 9, "process": "node", "address": "*",
                                           "ours": False, "container": "open-webui"}]}})
    with pytest.raises(SparkctlError, match=r"port 30000 \(HTTP\) is taken by node \(pid 9\) in "
                                            r"container open-webui on \*: stop it, or launch with"):
        PortsFree(WANTED).check(ctx("spark-b", foreign))


def test_a_listener_on_another_address_leaves_a_loopback_server_its_port() -> None:
    """The gateway's relay listens on the node's fabric address with its server's port number:
    a server bound to 127.0.0.1 can still bind that port (the kernel's rule), one bound to
    0.0.0.0 cannot, and a listener on every address blocks both."""
    relay = answer({"ports": {"30000": [{"pid": 5, "process": "python3", "address": "192.168.200.13",
                                         "ours": False, "container": None}]}})
    on_loopback = [WANTED[0]._replace(address="127.0.0.1")]
    assert PortsFree(on_loopback).check(ctx("spark-b", relay)) == Unchanged("free: 30000 (HTTP)")
    with pytest.raises(SparkctlError, match=r"on 192\.168\.200\.13"):
        PortsFree([WANTED[0]._replace(address="0.0.0.0")]).check(ctx("spark-b", relay))
    everywhere = answer({"ports": {"30000": [{"pid": 6, "process": "nginx", "address": "[::]",
                                              "ours": False, "container": None}]}})
    with pytest.raises(SparkctlError, match="nginx"):
        PortsFree(on_loopback).check(ctx("spark-b", everywhere))
    assert ports.clash(WANTED[0]._replace(address="localhost"), "127.0.0.1")


def test_the_launch_checks_bind_only_the_http_port_to_the_launch_host() -> None:
    from orchestrator.phases.launch_checks import with_checks

    recipe = load_recipe("qwen3.6-27b")
    check = with_checks([], recipe, ["spark-a"], recipe.image, INVENTORY,
                        host="127.0.0.1")[0].steps[0]
    assert isinstance(check, PortsFree)
    assert {p.what: p.address for p in check.wanted} == {"HTTP": "127.0.0.1"}


def test_a_node_that_cannot_say_is_not_refused_but_marked_unknown() -> None:
    said = PortsFree(WANTED).check(ctx("spark-b", answer({"error": "cannot list (ss)"})))
    assert isinstance(said, Unchanged) and said.reason.startswith("ports unknown (cannot list (ss))")


def test_the_phase_comes_first_and_asks_only_the_binding_nodes() -> None:
    from orchestrator.core.step import Phase

    first = ports.with_port_check([Phase("server-check", [], lambda i, n: {})], WANTED)
    assert [p.name for p in first] == ["port-check", "server-check"]
    assert first[0].facts(INVENTORY, INVENTORY.node("spark-a")) == {}
    command = first[0].facts(INVENTORY, INVENTORY.node("spark-b"))["commands"]["ports"]
    assert command.startswith("python3 -c ") and '"ports": [20000, 30000]' in command


# ------------------------------------------------------------------ the node side


@pytest.fixture
def node_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`ss` answers what ss.out holds; `docker ps` one sparkctl container whose first process is
    this test's own parent (so its PID namespace is ours: see the namespace stand-in below)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ss").write_text(f"#!/bin/sh\ncat {tmp_path}/ss.out\n")
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        f"echo \"$@\" >> {tmp_path}/docker.log\n"
        "case \"$1\" in ps) echo c0ffee ;; inspect) echo '/sparkctl-vllm-q 4000 q' ;; esac\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path


SS = ("LISTEN 0 128 127.0.0.1:8000 0.0.0.0:* users:((\"python3\",pid=4001,fd=7))\n"
      "LISTEN 0 128 0.0.0.0:6379 0.0.0.0:* users:((\"gcs_server\",pid=4002,fd=9))\n"
      "LISTEN 0 128 [::]:20000 [::]:* users:((\"python3\",pid=5000,fd=3))\n"
      "LISTEN 0 128 0.0.0.0:22 0.0.0.0:* users:((\"sshd\",pid=1,fd=3))\n")


def test_the_node_script_says_who_holds_each_wanted_port(node_tools: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (node_tools / "ss.out").write_text(SS)
    # PID namespaces: 4000 (the container's first process), 4001 and 4002 (exec'd into it) share
    # one; 5000 and this process are the node's
    spaces = {4000: "pid:[111]", 4001: "pid:[111]", 4002: "pid:[111]", 5000: "pid:[1]"}
    ran = run_node_script("ports.py", [json.dumps({"ports": [8000, 6379, 20000, 30000],
                                                   "cluster": "two-sparks"})], monkeypatch,
                          replace={'return os.readlink("/proc/%d/ns/pid" % pid)':
                                   f'return {spaces!r}.get(pid, "pid:[1]")'})
    assert ran.json == {"ports": {
        "8000": [{"pid": 4001, "process": "python3", "address": "127.0.0.1", "ours": True,
                  "container": "sparkctl-vllm-q", "server": "q"}],
        "6379": [{"pid": 4002, "process": "gcs_server", "address": "0.0.0.0", "ours": True,
                  "container": "sparkctl-vllm-q", "server": "q"}],
        "20000": [{"pid": 5000, "process": "python3", "address": "[::]", "ours": False,
                   "container": None, "server": None}]}}
    # another named server's listener is in the way of a launch of another name, not of its own
    found = ran.json["ports"]
    for launching, refused in (("q", False), ("other", True), (None, False)):
        step = PortsFree([ListenPort("spark-b", 6379, "Ray GCS", "launch with another --port")],
                         launching)
        answer = {"rc": 0, "out": json.dumps({"ports": found})}
        if refused:
            with pytest.raises(SparkctlError, match=r"port 6379 \(Ray GCS\) is taken by gcs_server "
                                                    r"\(pid 4002\) in container sparkctl-vllm-q of "
                                                    r"server q \(`sparkctl down --server q`\)"):
                step.check(ctx("spark-b", answer))
        else:
            assert isinstance(step.check(ctx("spark-b", answer)), Unchanged)
    assert "label=sparkctl.cluster=two-sparks" in (node_tools / "docker.log").read_text()


def test_the_node_script_without_ss_says_so(node_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (node_tools / "bin" / "ss").write_text("#!/bin/sh\necho 'ss: no netlink' >&2\nexit 1\n")
    ran = run_node_script("ports.py", [json.dumps({"ports": [8000], "cluster": "c"})], monkeypatch)
    assert ran.json["error"].startswith("cannot list listening sockets (ss -Hltnp)")
