"""`sparkctl up` on the simulated lab: a fresh 2-node cluster, an idempotent re-run, and an
inventory change that changes exactly what depends on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, Lab

pytestmark = pytest.mark.lab

CONTAINER = "trtllm-multinode"
WATCHED = ("/etc/sparkctl/* /etc/sparkctl/secrets /etc/netplan/40-sparkctl-fabric.yaml")


def sparkctl(*args: str, timeout: float = 300) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args, "--json"],
                            cwd=REPO, capture_output=True, text=True, timeout=timeout)
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"sparkctl {' '.join(args)} printed no JSON (exit "
                             f"{result.returncode}):\n{result.stdout}\n{result.stderr}") from None
    report["exit_code"] = result.returncode
    report["stderr"] = result.stderr
    return report


def up(inventory: Path, *extra: str) -> dict[str, Any]:
    return sparkctl("up", "--inventory", str(inventory), "--yes", *extra)


def changed_steps(report: dict[str, Any]) -> set[str]:
    return {f"{node}:{s['phase']}/{s['step']}" for node, host in report["hosts"].items()
            for s in host["steps"] if s["status"] == "changed"}


def failures(report: dict[str, Any]) -> str:
    return "\n".join(f"{node} {s['phase']}/{s['step']}: {s['message']}"
                     for node, host in report["hosts"].items() for s in host["steps"]
                     if s["status"] == "failed") + report["stderr"][-2000:]


def snapshot(lab: Lab) -> dict[str, str]:
    """What a no-op run must not touch: container id and start time, file mtimes."""
    out = {}
    for node in lab.nodes:
        container = lab.ssh(node, f"docker inspect -f '{{{{.Id}}}} {{{{.State.StartedAt}}}}' "
                                  f"{CONTAINER}").stdout.strip()
        files = lab.ssh(node, f"sudo stat -c '%n %Y %a' {WATCHED} 2>/dev/null; true").stdout
        out[node] = container + "\n" + files
    return out


@pytest.fixture
def brought_up(lab: Lab) -> Lab:
    report = up(lab.inventory)
    assert report["exit_code"] == 0 and report["ok"], failures(report)
    return lab


def test_up_then_mpirun_reaches_every_container(brought_up: Lab) -> None:
    lab = brought_up
    result = lab.ssh(lab.nodes[0], f"docker exec {CONTAINER} mpirun -np 2 hostname")
    assert sorted(result.stdout.split()) == sorted(lab.nodes)


def test_second_up_changes_nothing(brought_up: Lab) -> None:
    lab = brought_up
    before = snapshot(lab)
    report = up(lab.inventory)
    assert report["ok"] and report["changed"] == 0, changed_steps(report)
    assert snapshot(lab) == before
    mpi = [s for s in report["hosts"][lab.nodes[0]]["steps"] if s["phase"] == "mpi"]
    assert mpi and "not re-run" in mpi[0]["message"]
    verified = up(lab.inventory, "--verify")
    assert verified["changed"] == 0 and snapshot(lab) == before
    mpi = [s for s in verified["hosts"][lab.nodes[0]]["steps"] if s["phase"] == "mpi"]
    assert "reached" in mpi[0]["message"], failures(verified)


def test_container_sshd_is_locked_down(brought_up: Lab) -> None:
    lab = brought_up
    node = lab.nodes[0]
    listening = lab.ssh(node, "ss -Hltn 'sport = :2233'").stdout.split()
    local = sorted(w.rsplit(":", 1)[0] for w in listening if w.endswith(":2233"))
    assert local == ["192.168.200.12", "192.168.201.12"]
    inspect = lab.ssh(node, f"docker inspect {CONTAINER}").stdout
    assert "PRIVATE KEY" not in inspect and '"AutoRemove": false' in inspect
    config = lab.ssh(node, "cat /etc/sparkctl/ssh_config /etc/sparkctl/sshd_config").stdout
    assert "StrictHostKeyChecking yes" in config and "StrictHostKeyChecking no" not in config
    modes = lab.ssh(node, "sudo stat -c '%a %n' /etc/sparkctl/cluster_key "
                          "/etc/sparkctl/ssh_host_ed25519_key").stdout
    assert modes.split()[0::2] == ["600", "600"]


def test_changed_port_changes_exactly_what_depends_on_it(brought_up: Lab, tmp_path: Path) -> None:
    lab = brought_up
    data = yaml.safe_load(lab.inventory.read_text())
    data["engines"]["trtllm"]["container"]["ssh_port"] = 2234
    changed_inventory = tmp_path / "inventory.yml"
    changed_inventory.write_text(yaml.safe_dump(data))
    before = snapshot(lab)
    try:
        report = up(changed_inventory)
        assert report["ok"], failures(report)
        assert changed_steps(report) == {
            f"{n}:{step}" for n in lab.nodes for step in ("ssh-trust/files", "container/container")
        }
        files = [s for s in report["hosts"][lab.nodes[0]]["steps"] if s["step"] == "files"]
        assert files[0]["message"] == "write known_hosts, ssh_config, sshd_config"
        after = snapshot(lab)
        for node in lab.nodes:
            assert after[node].splitlines()[0] != before[node].splitlines()[0]  # replaced
            unchanged = [line for line in before[node].splitlines()
                         if any(name in line for name in ("authorized_keys", "hostfile",
                                                          "cluster_key", "entrypoint.sh"))]
            assert unchanged and all(line in after[node].splitlines() for line in unchanged)
        result = lab.ssh(lab.nodes[0], f"docker exec {CONTAINER} mpirun -np 2 hostname")
        assert sorted(result.stdout.split()) == sorted(lab.nodes)
    finally:
        restored = up(lab.inventory)
    assert restored["ok"], failures(restored)
