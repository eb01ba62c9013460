"""Nothing hard-coded to two: `up` and `netcheck` on a 3-node ring and a 4-node switch lab; on the
ring, every engine's containers carry NVIDIA's ring settings and mpirun forwards them; on the
switch, the built-in four-Spark recipes of vLLM and SGLang launch, and an imported four-node
eugr recipe passes `launch --dry-run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Sparkctl

pytestmark = pytest.mark.lab

LAB_ID = os.environ.get("SPARKLAB_TOPOLOGY_ID", "2")
BIN = Path(sys.executable).parent
STATE = Path(f"/var/lib/sparklab/{LAB_ID}")
FOREIGN = Path(__file__).parents[1] / "unit" / "foreign_recipes"


# imported recipes: the lab's own folder
sparkctl = Sparkctl(STATE / "ctl", timeout=300,
                    env={"SPARKLAB_ID": LAB_ID, "XDG_CONFIG_HOME": str(STATE / "xdg-config")})
ENV = sparkctl.environment()


RING = {"NCCL_IB_MERGE_NICS=0", "NCCL_NET_PLUGIN=none", "NCCL_IB_SUBNET_AWARE_ROUTING=1"}


def container_env(node: str, container: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "sparklab.cli", "exec", node, "--", "docker",
                          "inspect", "-f", "{{json .Config.Env}}", container],
                         env=ENV, capture_output=True, text=True, timeout=60, check=True).stdout
    return set(json.loads(out))


def ring_engines(inventory: str) -> None:
    """The ring's three NCCL settings reach vLLM's and SGLang's containers too (on the two nodes
    each serves from), and TensorRT-LLM's mpirun forwards every fabric variable (-x)."""
    env = {**ENV, "HF_TOKEN": "hf_topologyLabToken000000000000"}

    def launch(recipe: str) -> str:
        # one server at a time here; `down` takes the fetching container too: `up` again
        sparkctl("down", "--inventory", inventory, "--yes")
        assert sparkctl("up", "--inventory", inventory, "--yes").returncode == 0
        result = subprocess.run([str(BIN / "sparkctl"), "launch", recipe, "--inventory", inventory,
                                 "--yes", "--timeout", "240"], env=env,
                                capture_output=True, text=True, timeout=400, check=False)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        return result.stdout

    launch("minimax-m2.7-mp")  # vLLM's own multi-node on NVIDIA's current image (no Ray)
    for node in ("spark-a", "spark-b"):
        assert container_env(node, "sparkctl-vllm-minimax-m2.7-mp") >= RING, node
    launch("qwen3.6-27b-tp2")  # SGLang across two nodes
    for node in ("spark-a", "spark-b"):
        assert container_env(node, "sparkctl-sglang-qwen3.6-27b-tp2") >= RING, node
    sparkctl("down", "--inventory", inventory, "--yes")
    assert sparkctl("up", "--inventory", inventory, "--yes").returncode == 0
    plan = subprocess.run([str(BIN / "sparkctl"), "launch", "qwen3-235b", "--inventory", inventory,
                           "--dry-run", "--json"], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    text = plan.stdout
    assert "mpirun -np 2" in text, text[-2000:] + plan.stderr
    for name in ("NCCL_IB_MERGE_NICS", "NCCL_NET_PLUGIN", "NCCL_IB_SUBNET_AWARE_ROUTING",
                 "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "UCX_NET_DEVICES"):
        assert f"-x {name}" in text, name
    # each rank bootstraps NCCL on its own link to rank 0 (spark-a's port 1, spark-b's port 0)
    assert "0) export NCCL_SOCKET_IFNAME==enp1s0f1np1;; 1) export NCCL_SOCKET_IFNAME==enp1s0f0np0;;" \
        in text.replace("\\", ""), text[-2000:]
    launch("qwen3-235b")  # TensorRT-LLM's two ranks meet over the ring (it hung before)
    sparkctl("down", "--inventory", inventory, "--yes")


def switch_engines(inventory: str) -> None:
    """A recipe built in for four Sparks launches on four nodes, for vLLM and for SGLang (one
    server at a time: each takes every node); an imported eugr recipe for four plans there."""
    env = {**ENV, "HF_TOKEN": "hf_topologyLabToken000000000000"}

    def launch(*args: str) -> str:
        result = subprocess.run([str(BIN / "sparkctl"), "launch", *args, "--inventory", inventory,
                                 "--yes", "--timeout", "240"], env=env,
                                capture_output=True, text=True, timeout=400, check=False)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        return result.stdout

    nodes = [f"spark-{n}" for n in "abcd"]
    launch("nemotron-3-ultra-tp4")  # vLLM, tensor parallel 4 (its own multi-node: no Ray)
    for node in nodes:
        assert container_env(node, "sparkctl-vllm-nemotron-3-ultra-tp4") >= {
            "VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm"}, node
    assert sparkctl("down", "--inventory", inventory, "--server", "nemotron-3-ultra-tp4",
                    "--yes").returncode == 0
    launch("qwen3.5-397b-fp8-tp4")  # SGLang, tensor parallel 4, a rank on every node
    status = json.loads(sparkctl("status", "--inventory", inventory, "--json").stdout)
    server = next(s for s in status["servers"] if s["name"] == "qwen3.5-397b-fp8-tp4")
    assert (sorted(server["nodes"]), server["state"]) == (nodes, "healthy"), server
    assert sparkctl("down", "--inventory", inventory, "--server", "qwen3.5-397b-fp8-tp4",
                    "--yes").returncode == 0
    imported = sparkctl("recipes", "import", str(FOREIGN / "eugr-four-node.yaml"), "--force")
    assert imported.returncode == 0, imported.stderr
    plan = launch("eugr-four-node", "--dry-run", "--json")  # by name, from the user folder
    assert "--tensor-parallel-size 4" in plan, plan[-2000:]
    sparkctl("down", "--inventory", inventory, "--yes")


@pytest.mark.parametrize(("topology", "nodes"), [("ring", 3), ("switch", 4)])
def test_up_and_netcheck_beyond_two_nodes(topology: str, nodes: int) -> None:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root")
    lab = sparkctl("lab", "up", "--force", "--topology", topology, "--nodes", str(nodes))
    assert lab.returncode == 0, lab.stderr
    inventory = str(STATE / "inventory.yml")
    try:
        up = sparkctl("up", "--inventory", inventory, "--yes", "--json")
        assert up.returncode == 0, up.stdout + up.stderr
        report = json.loads(up.stdout)
        head = report["hosts"]["spark-a"]["steps"]
        mpirun = next(s for s in head if s["step"] == "mpirun")
        names = [chr(ord("a") + i) for i in range(nodes)]
        assert all(f"spark-{n}" in mpirun["message"] for n in names), mpirun
        if topology == "ring":  # NVIDIA's ring settings reach the containers
            env = subprocess.run(
                [sys.executable, "-m", "sparklab.cli", "exec", "spark-a", "--", "docker",
                 "inspect", "-f", "{{json .Config.Env}}", "trtllm-multinode"],
                env=ENV, capture_output=True, text=True, timeout=60, check=True).stdout
            assert set(json.loads(env)) >= RING, env
        check = sparkctl("netcheck", "--inventory", inventory, "--json")
        assert check.returncode == 0, check.stdout[-3000:] + check.stderr
        checks = json.loads(check.stdout)["checks"]
        pinged = {(c["node"], c["peer"]) for c in checks if c["check"] == "ping"}
        if topology == "switch":  # every node reaches every other node
            assert len(pinged) == nodes * (nodes - 1)
            switch_engines(inventory)
        else:  # each node reaches its two ring neighbours
            assert len(pinged) == nodes * 2
            ring_engines(inventory)
    finally:
        sparkctl("lab", "down")
