"""`sparkctl init` on the lab: cabled on QSFP port 0 (not the inventory's default port 1) it finds
the cabled twins with ibdev2netdev, writes an inventory naming them, and `up` accepts it; a node
whose cable is pulled is refused with exit 2, naming it. On nodes NVIDIA Sync configured it adopts
their network (up leaves the file byte for byte, down --network leaves it and its addresses); on a
3-node ring and a 4-node switch it writes the inventory `up` and `netcheck` accept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import Sparkctl

pytestmark = pytest.mark.lab

LAB_ID = os.environ.get("SPARKLAB_TOPOLOGY_ID", "2")
BIN = Path(sys.executable).parent
STATE = Path(f"/var/lib/sparklab/{LAB_ID}")
PORT0 = ["enp1s0f0np0", "enP2p1s0f0np0"]


sparkctl = Sparkctl(STATE / "ctl-init", env={"SPARKLAB_ID": LAB_ID})
ENV = sparkctl.environment()


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


def lab_access() -> tuple[list[str], list[str]]:
    lab_inventory = yaml.safe_load((STATE / "inventory.yml").read_text())
    return ([node["host"] for node in lab_inventory["nodes"]],
            ["--ssh-key", lab_inventory["cluster"]["ssh_key"],
             "--known-hosts", lab_inventory["cluster"]["known_hosts"]])


def node_sh(node: str, command: str) -> str:
    return subprocess.run([sys.executable, "-m", "sparklab.cli", "exec", node, "--", "sh", "-c",
                           command], env=ENV, capture_output=True, text=True, timeout=60,
                          check=True).stdout


SYNC_FILE = "/etc/netplan/99-nvidia-sync-cluster.yaml"


def test_init_adopts_a_sync_network_and_nothing_rewrites_it(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root")
    lab = sparkctl("lab", "up", "--force", "--preconfigured", "sync")
    assert lab.returncode == 0, lab.stderr
    try:
        hosts, access = lab_access()
        before = {n: node_sh(n, f"sha256sum {SYNC_FILE}; ls /etc/netplan") for n in ("spark-a", "spark-b")}
        written = tmp_path / "sync.yml"
        init = sparkctl("init", *hosts, *access, "-o", str(written), "--yes")
        assert init.returncode == 0, init.stdout + init.stderr
        assert f"adopting the network of {SYNC_FILE}" in init.stderr
        inventory = yaml.safe_load(written.read_text())
        assert inventory["fabric"]["network"] == "adopted" and inventory["fabric"]["mtu"] == 9000
        assert inventory["nodes"][1]["addresses"] == {"enp1s0f1np1": "10.100.32.2/24",
                                                      "enP2p1s0f1np1": "10.100.33.2/24"}

        up = sparkctl("up", "--inventory", str(written), "-v", "--yes")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "network/adopted: adopted network (/etc/netplan/99-nvidia-sync-cluster.yaml)" \
            in up.stdout + up.stderr
        check = sparkctl("netcheck", "--inventory", str(written))
        assert check.returncode == 0, check.stdout[-3000:] + check.stderr
        down = sparkctl("down", "--network", "--inventory", str(written), "--yes")
        assert down.returncode == 0, down.stdout[-3000:] + down.stderr
        assert "left alone: the adopted network" in down.stdout
        for node, seen in before.items():  # byte for byte, no file of sparkctl's beside it
            assert node_sh(node, f"sha256sum {SYNC_FILE}; ls /etc/netplan") == seen, node
        assert "10.100.32.2/24" in node_sh("spark-b", "ip -o addr show dev enp1s0f1np1")
    finally:
        sparkctl("lab", "down")


@pytest.mark.parametrize(("topology", "nodes"), [("ring", 3), ("switch", 4)])
def test_init_on_a_ring_and_a_switch(topology: str, nodes: int, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root")
    lab = sparkctl("lab", "up", "--force", "--topology", topology, "--nodes", str(nodes))
    assert lab.returncode == 0, lab.stderr
    try:
        hosts, access = lab_access()
        written = tmp_path / f"{topology}.yml"
        init = sparkctl("init", *hosts, *access, "-o", str(written), "--yes")
        assert init.returncode == 0, init.stdout + init.stderr
        inventory = yaml.safe_load(written.read_text())
        assert inventory["fabric"]["topology"] == topology
        assert len(inventory["nodes"]) == nodes
        if topology == "ring":
            assert "a ring of 3" in init.stderr and len(inventory["fabric"]["interfaces"]) == 4
        else:
            assert "reaches every other node: behind a switch" in init.stderr
        up = sparkctl("up", "--inventory", str(written), "--yes")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        check = sparkctl("netcheck", "--inventory", str(written), "--json")
        assert check.returncode == 0, check.stdout[-3000:] + check.stderr
    finally:
        sparkctl("lab", "down")
