"""Nothing hard-coded to two: `up` and `netcheck` on a 3-node ring and a 4-node switch lab."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

LAB_ID = os.environ.get("SPARKLAB_TOPOLOGY_ID", "2")
BIN = Path(sys.executable).parent
STATE = Path(f"/var/lib/sparklab/{LAB_ID}")
ENV = {**os.environ, "SPARKLAB_ID": LAB_ID, "SPARKCTL_STATE_DIR": str(STATE / "ctl")}


def sparkctl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "sparkctl"), *args], env=ENV, capture_output=True,
                          text=True, timeout=timeout, check=False)


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
            assert {"NCCL_IB_MERGE_NICS=0", "NCCL_NET_PLUGIN=none",
                    "NCCL_IB_SUBNET_AWARE_ROUTING=1"} <= set(json.loads(env)), env
        check = sparkctl("netcheck", "--inventory", inventory, "--json")
        assert check.returncode == 0, check.stdout[-3000:] + check.stderr
        checks = json.loads(check.stdout)["checks"]
        pinged = {(c["node"], c["peer"]) for c in checks if c["check"] == "ping"}
        if topology == "switch":  # every node reaches every other node
            assert len(pinged) == nodes * (nodes - 1)
        else:  # each node reaches its two ring neighbours
            assert len(pinged) == nodes * 2
    finally:
        sparkctl("lab", "down")
