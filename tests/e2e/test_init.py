"""`sparkctl init` on a lab cabled on QSFP port 0 (not the inventory's default port 1): it finds
the cabled twins with ibdev2netdev, writes an inventory naming them, and `up` accepts it; a node
whose cable is pulled is refused with exit 2, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

LAB_ID = os.environ.get("SPARKLAB_TOPOLOGY_ID", "2")
BIN = Path(sys.executable).parent
STATE = Path(f"/var/lib/sparklab/{LAB_ID}")
ENV = {**os.environ, "SPARKLAB_ID": LAB_ID, "SPARKCTL_STATE_DIR": str(STATE / "ctl-init")}
PORT0 = ["enp1s0f0np0", "enP2p1s0f0np0"]


def sparkctl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "sparkctl"), *args], env=ENV, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_init_finds_port_0_and_up_accepts_it(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root")
    lab = sparkctl("lab", "up", "--force", "--ports", ",".join(PORT0))
    assert lab.returncode == 0, lab.stderr
    try:
        lab_inventory = yaml.safe_load((STATE / "inventory.yml").read_text())
        hosts = [node["host"] for node in lab_inventory["nodes"]]
        access = ["--ssh-key", lab_inventory["cluster"]["ssh_key"],
                  "--known-hosts", lab_inventory["cluster"]["known_hosts"]]
        written = tmp_path / "inv.yml"
        init = sparkctl("init", *hosts, *access, "-o", str(written), "--yes")
        assert init.returncode == 0, init.stdout + init.stderr
        assert "port 0 (enp1s0f0np0, enP2p1s0f0np0) is Up on all 2 nodes" in init.stderr
        text = written.read_text()
        assert text.startswith("# Written by `sparkctl init`")
        inventory = yaml.safe_load(text)
        assert inventory["fabric"]["interfaces"] == PORT0
        assert inventory["cluster"]["management_interface"] == "eth0"
        assert [n["name"] for n in inventory["nodes"]] == ["spark-a", "spark-b"]
        assert inventory["nodes"][1]["addresses"] == {"enp1s0f0np0": "192.168.200.13/24",
                                                      "enP2p1s0f0np0": "192.168.201.13/24"}

        up = sparkctl("up", "--inventory", str(written), "-v", "--yes")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "192.168.200.13" in up.stdout + up.stderr

        # a pulled cable on one node: refused, naming the node and its links; nothing written
        cut = sparkctl("lab", "fault", "cut-cable", "--node", "spark-b", "--interface", PORT0[0])
        assert cut.returncode == 0, cut.stderr
        again = sparkctl("init", *hosts, *access, "-o", str(tmp_path / "no.yml"), "--yes")
        assert again.returncode == 2, again.stdout + again.stderr
        assert "cabling is inconsistent" in again.stderr and hosts[1] in again.stderr
        assert not (tmp_path / "no.yml").exists()
    finally:
        sparkctl("lab", "down")
