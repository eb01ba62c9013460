"""Faults while `sparkctl up` runs on the lab: each one named (node, step), the right exit code,
nothing changed that should not have, and a re-run that converges.

Covered elsewhere (not repeated here): an unreachable node and a changed host key
(tests/e2e/test_transport_trust.py), a cable cut during the network phase
(tests/e2e/test_up_network.py), a hanging engine (tests/e2e/test_launch.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Lab
from faultkit import (
    CONTAINER,
    LOCK_DIR,
    SPARKCTL,
    container_id,
    converge,
    converged_twice,
    env,
    explain,
    hooked,
    lock_is_free,
    report_of,
    snapshot,
    sparkctl,
    steps,
    up,
    wait_for,
    wait_for_file,
)

pytestmark = pytest.mark.lab


@pytest.fixture
def cluster(lab: Lab) -> Lab:
    """The lab, converged by `up`, with no fault left from an earlier test."""
    lab.cli("fault", "restore", check=True)
    converge(lab)
    return lab


def inventory_with_mtu(lab: Lab, tmp_path: Path, mtu: int) -> Path:
    data: dict[str, Any] = yaml.safe_load(lab.inventory.read_text())
    data["fabric"]["mtu"] = mtu
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def remove_container(lab: Lab, node: str) -> None:
    lab.exec(node, f"docker rm -f {CONTAINER}", user="nvidia")


def test_port_taken_fails_the_container_step_naming_node_and_port(cluster: Lab, tally: Any) -> None:
    lab = cluster
    head, other = lab.nodes[0], lab.nodes[1]
    head_container = container_id(lab, head)
    remove_container(lab, other)
    lab.cli("fault", "occupy-port", "--node", other, "--port", "2233", check=True)
    try:
        result = up(lab)
        assert result.returncode == 1, explain(result)
        report = report_of(result)
        failed = steps(report, "failed")
        assert [(n, p, s) for n, p, s, _ in failed] == [(other, "container", "container")], failed
        message = failed[0][3]
        assert other in message and "2233" in message and "already in use" in message, message
        assert container_id(lab, head) == head_container, "the head's container must be untouched"
        assert not any(s[1] == "mpi" for s in steps(report)), "mpi must not run after a failure"
        assert lock_is_free(lab)
    finally:
        lab.cli("fault", "restore", check=True)
    report = converge(lab)
    assert (other, "container", "container") in [(n, p, s) for n, p, s, _ in steps(report, "changed")]
    assert "reached" in " ".join(m for _, p, _, m in steps(report) if p == "mpi")
    tally.add("faults survived")


def test_disk_full_fails_preflight_and_changes_nothing(cluster: Lab, tmp_path: Path,
                                                       tally: Any) -> None:
    lab = cluster
    other = lab.nodes[1]
    wanted = inventory_with_mtu(lab, tmp_path, 8000)  # a run that would change the network
    before = {node: snapshot(lab, node) for node in lab.nodes}
    mtu_before = {node: lab.exec(node, "cat /sys/class/net/enp1s0f1np1/mtu").stdout
                  for node in lab.nodes}
    lab.cli("fault", "disk-full", "--node", other, check=True)
    try:
        result = up(lab, wanted)
        assert result.returncode == 1, explain(result)
        report = report_of(result)
        failed = steps(report, "failed")
        assert [(n, p, s) for n, p, s, _ in failed] == [(other, "preflight", "checks")], failed
        message = failed[0][3]
        assert other in message and "GB free" in message and "nothing was changed" in message
        assert report["changed"] == 0
        assert {s[1] for s in steps(report)} == {"preflight"}, steps(report)
        for node in lab.nodes:
            assert snapshot(lab, node) == before[node], f"{node}: files changed"
            assert lab.exec(node, "cat /sys/class/net/enp1s0f1np1/mtu").stdout == mtu_before[node]
        assert lock_is_free(lab)
    finally:
        lab.cli("fault", "restore", check=True)
    converged_twice(lab)
    tally.add("faults survived")


def test_container_sshd_dying_is_named_by_netcheck_and_repaired_by_up(cluster: Lab,
                                                                      tally: Any) -> None:
    lab = cluster
    other = lab.nodes[1]
    old = container_id(lab, other)
    # the entrypoint execs sshd: it is the container's PID 1, and the container ends with it
    # (the docker exec itself is killed with the container, so its exit status says nothing)
    lab.exec(other, f"docker exec {CONTAINER} sh -c 'kill $(cat /run/sparkctl-sshd.pid)'",
             user="nvidia", check=False)
    wait_for(lab, other, f"docker inspect -f '{{{{.State.Status}}}}' {CONTAINER} | grep -qv running")
    check = sparkctl(lab, "netcheck", "--inventory", str(lab.inventory), "--json")
    assert check.returncode == 1, explain(check)
    failed = [c for c in report_of(check)["checks"] if c["status"] == "fail"]
    container = [c for c in failed if c["check"] == "container"]
    assert [c["node"] for c in container] == [other], failed
    assert "exited" in container[0]["message"] and "sparkctl up" in container[0]["message"]
    refused = [c for c in failed if c["check"] == "ssh-node"]
    assert refused and all(c["peer"] == other and "refused" in c["message"] for c in refused)
    report = converge(lab)
    changed = [(n, p, s) for n, p, s, _ in steps(report, "changed")]
    assert changed == [(other, "container", "container")], changed
    assert container_id(lab, other) != old and container_id(lab, other).endswith("running")
    healthy = sparkctl(lab, "netcheck", "--inventory", str(lab.inventory), "--json")
    assert healthy.returncode == 0, explain(healthy)
    tally.add("faults survived")


DROP_SSH_OF_NODE = """
from sparklab.node import node_exec
from orchestrator.phases import container
original = container.Container.apply
# the node-side sshd processes of the cluster user's session, found with ps in the node
KILL = "ps -eo pid=,args= | awk '$2 == \\"sshd:\\" && $3 ~ /^nvidia/ {{print $1}}' | xargs -r kill"
def apply(self, ctx, change):
    if ctx.node.name == {node!r}:
        node_exec({lab_id}, {node!r}, ["sh", "-c", KILL], check=False)
        time.sleep(0.5)
    return original(self, ctx, change)
container.Container.apply = apply
"""


def test_connection_dropped_mid_phase_is_named_and_rerun_converges(cluster: Lab,
                                                                   tally: Any) -> None:
    lab = cluster
    head, other = lab.nodes[0], lab.nodes[1]
    remove_container(lab, other)
    hook = DROP_SSH_OF_NODE.format(node=other, lab_id=lab.lab_id)
    process = hooked(lab, hook, "up", "--inventory", str(lab.inventory), "--yes", "--json")
    out, err = process.communicate(timeout=240)
    result_text = f"exit {process.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    assert process.returncode == 1, result_text
    report = json.loads(out)
    failed = [(n, p, s, m) for n, p, s, m in steps(report, "failed")]
    assert [(n, p, s) for n, p, s, _ in failed] == [(other, "container", "container")], failed
    assert other in failed[0][3] and "connection" in failed[0][3].lower(), failed[0][3]
    assert not report["hosts"][head].get("error")
    assert not any(s[1] == "mpi" for s in steps(report)), "mpi must not run after a failure"
    assert lock_is_free(lab)
    assert container_id(lab, other) == "none"
    report = converge(lab)
    assert (other, "container", "container") in [(n, p, s) for n, p, s, _ in steps(report, "changed")]
    converged_twice(lab)
    tally.add("faults survived")


def test_ctrl_c_during_up_says_what_changed_releases_the_lock_and_rerun_converges(
        cluster: Lab, tmp_path: Path, tally: Any) -> None:
    lab = cluster
    wanted = inventory_with_mtu(lab, tmp_path, 8000)


    process = subprocess.Popen([SPARKCTL, "up", "--inventory", str(wanted), "--yes"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env(lab))
    seen = []
    assert process.stderr is not None
    for line in process.stderr:
        seen.append(line)
        if "phase network" in line:
            time.sleep(0.3)  # inside the network phase: facts, netplan, or apply
            process.send_signal(signal.SIGINT)
            break
    out, err = process.communicate(timeout=120)
    stderr = "".join(seen) + err
    assert process.returncode == 130, f"{process.returncode}\n{out}\n{stderr}"
    assert "interrupted" in stderr and "changes made:" in stderr, stderr
    assert "interrupted during network/" in stderr, stderr
    assert "Traceback" not in stderr
    assert lock_is_free(lab), f"{LOCK_DIR} left on the head"
    converged_twice(lab)
    for node in lab.nodes:
        assert lab.exec(node, "cat /sys/class/net/enp1s0f1np1/mtu").stdout.strip() == "9000"
    tally.add("faults survived")


HOLD_THE_LOCK = """
from orchestrator.engines.trtllm import mpi
original = mpi.MpirunHostname.apply
def apply(self, ctx, change):
    open({held!r}, "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists({release!r}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return original(self, ctx, change)
mpi.MpirunHostname.apply = apply
"""


def test_two_ups_at_once_one_waits_for_the_lock(cluster: Lab, tmp_path: Path, tally: Any) -> None:
    """The first up changes something (another MTU), so it holds the lock from its first change
    on (a run that changes nothing takes none: issue 40); held in its last phase, a second up
    is refused naming it."""
    lab = cluster
    held, release = tmp_path / "held", tmp_path / "release"
    wanted = inventory_with_mtu(lab, tmp_path, 8000)
    first = hooked(lab, HOLD_THE_LOCK.format(held=str(held), release=str(release)),
                   "up", "--inventory", str(wanted), "--yes", "--json")
    try:
        assert wait_for_file(held), "the first up never reached its last phase"
        assert not lock_is_free(lab)
        second = up(lab)
        assert second.returncode == 1, explain(second)
        message = second.stderr
        assert "locked by another sparkctl run" in message, message
        assert f"pid {first.pid}" in message and "up by" in message, message
        assert "--break-lock" in message
        assert "Traceback" not in message
    finally:
        release.touch()
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, f"{out[-2000:]}\n{err[-2000:]}"
    assert lock_is_free(lab)
    converge(lab)
    tally.add("faults survived")


NVIDIA_FABRIC = """# NVIDIA's two-Spark addressing, applied by hand: both twins in one /24
network:
  version: 2
  ethernets:
    enp1s0f1np1:
      addresses: [192.168.100.10/24]
    enP2p1s0f1np1:
      addresses: [192.168.100.11/24]
"""


def test_another_netplan_file_addressing_the_fabric_fails_preflight(cluster: Lab, tmp_path: Path,
                                                                    tally: Any) -> None:
    """A file of the user's own (not sparkctl's) already addressing the fabric interfaces: `up`
    stops at preflight naming node, file, interfaces and addresses with the fix, before any
    `netplan apply` (which would roll back after ~23 s saying "check the cables")."""
    lab = cluster
    other = lab.nodes[1]
    path = "/etc/netplan/01-spark-fabric.yaml"
    wanted = inventory_with_mtu(lab, tmp_path, 8000)  # a run that would change the network
    lab.exec(other, f"umask 077; cat > {path} <<'EOF'\n{NVIDIA_FABRIC}EOF")
    try:
        before = {node: snapshot(lab, node) for node in lab.nodes}
        live = {node: lab.exec(node, "ip -br addr show; cat /sys/class/net/*/mtu").stdout
                for node in lab.nodes}
        started = time.monotonic()
        result = up(lab, wanted)
        print(f"up failed in {time.monotonic() - started:.1f}s")  # shown in the docs, not asserted
        assert result.returncode == 1, explain(result)
        report = report_of(result)
        failed = steps(report, "failed")
        assert [(n, p, s) for n, p, s, _ in failed] == [(other, "preflight", "checks")], failed
        message = failed[0][3]
        print(message)
        for words in (path, "enp1s0f1np1: 192.168.100.10/24", "enP2p1s0f1np1: 192.168.100.11/24",
                      "share 192.168.100.0/24", f"sudo rm {path}", "sudo netplan apply",
                      "nothing was changed"):
            assert words in message, message
        assert report["changed"] == 0 and {s[1] for s in steps(report)} == {"preflight"}
        for node in lab.nodes:
            assert snapshot(lab, node) == before[node], f"{node}: files changed"
            assert lab.exec(node, "ip -br addr show; cat /sys/class/net/*/mtu").stdout == live[node]
        assert lock_is_free(lab)
        human = sparkctl(lab, "up", "--inventory", str(wanted), "--yes")
        print(human.stdout + human.stderr)  # the docs show this output
    finally:
        lab.exec(other, f"rm -f {path}")
    converged_twice(lab)
    tally.add("faults survived")
