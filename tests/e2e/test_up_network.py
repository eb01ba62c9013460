"""up's preflight + network phases on the simulated lab (real sshd, real netplan, real links).

Runs a plan of just these two phases (the later phases are tested elsewhere).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, Lab, lab_cli

from orchestrator.core.report import Report
from orchestrator.core.session import open_session, run_plan
from orchestrator.core.step import Plan, RunOptions
from orchestrator.inventory_checks import load_inventory
from orchestrator.paths import NETPLAN_FILE
from orchestrator.phases import netguard, network, preflight

pytestmark = pytest.mark.lab
FABRIC = ("enp1s0f1np1", "enP2p1s0f1np1")


def run_phases(inventory_path: Path, dry_run: bool = False) -> Report:
    inventory = load_inventory(inventory_path)
    plan = Plan("up", [preflight.phase(inventory), network.phase(inventory)])
    with open_session(inventory, "up", quiet=True, interactive=False) as session:
        assert not session.unreachable, session.report.to_json()
        run_plan(session, plan, RunOptions(command="up", dry_run=dry_run))
        return session.finish()


def statuses(report: Report) -> dict[tuple[str, str, str], str]:
    return {(node, s.phase, s.step): s.status for node, host in report.hosts.items() for s in host.steps}


def messages(report: Report) -> str:
    return "\n".join(s.message for host in report.hosts.values() for s in host.steps)


def with_inventory(lab: Lab, tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    data = yaml.safe_load(lab.inventory.read_text())
    change(data)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def link_state(lab: Lab, node: str, iface: str) -> tuple[int, list[str]]:
    """MTU and IPv4 addresses, read inside the node with `ip`."""
    import json

    out = lab.exec(node, ["ip", "-j", "addr", "show", "dev", iface]).stdout
    entry = json.loads(out)[0]
    return entry["mtu"], [f"{a['local']}/{a['prefixlen']}" for a in entry.get("addr_info", [])
                          if a["family"] == "inet"]


def netplan_text(lab: Lab, node: str) -> str:
    return lab.exec(node, f"cat {NETPLAN_FILE} 2>/dev/null || true").stdout


def converge(lab: Lab) -> None:
    report = run_phases(lab.inventory)
    assert report.ok, report.to_json()


def test_fresh_lab_gets_addresses_and_mtu_then_nothing_changes(lab: Lab) -> None:
    report = run_phases(lab.inventory)
    assert report.ok, report.to_json()
    for node in lab.nodes:
        for iface in FABRIC:
            mtu, addresses = link_state(lab, node, iface)
            wanted = next(n for n in lab.data["nodes"] if n["name"] == node)["addresses"][iface]
            assert mtu == 9000 and wanted in addresses, (node, iface, mtu, addresses)
        mode = lab.exec(node, f"stat -c %a {NETPLAN_FILE}").stdout.strip()
        assert mode == "600"
    again = run_phases(lab.inventory)
    assert again.ok and again.count("changed") == 0, again.to_json()


def test_mtu_change_touches_only_the_netplan_file_and_apply(lab: Lab, tmp_path: Path) -> None:
    converge(lab)
    path = with_inventory(lab, tmp_path, lambda d: d["fabric"].update(mtu=8000))
    report = run_phases(path)
    assert report.ok, report.to_json()
    changed = sorted({(phase, step) for (_, phase, step), st in statuses(report).items()
                      if st == "changed"})
    assert changed == [("network", "apply"), ("network", "netplan")]
    assert "confirmed" in messages(report)
    assert link_state(lab, "spark-b", "enP2p1s0f1np1")[0] == 8000
    converge(lab)
    assert link_state(lab, "spark-b", "enP2p1s0f1np1")[0] == 9000


def test_fabric_broken_right_before_apply_is_rolled_back(lab: Lab, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, tally: Any) -> None:
    converge(lab)
    before = netplan_text(lab, "spark-a")
    original = network.NetplanApply.apply
    cut: list[bool] = []

    def cut_then_apply(self: Any, ctx: Any, change: Any) -> Any:
        if not cut:
            cut.append(True)
            # every frame leaving spark-a's enp1s0f1np1 is dropped. (`cut-cable` sets the veth
            # admin-down, which netplan apply's networkd simply sets up again.)
            lab_cli("fault", "delay", "--node", "spark-a", "--interface", "enp1s0f1np1",
                    "--ms", "1", "--loss", "100", lab_id=lab.lab_id, check=True)
        return original(self, ctx, change)

    monkeypatch.setattr(network.NetplanApply, "apply", cut_then_apply)
    path = with_inventory(lab, tmp_path, lambda d: d["fabric"].update(mtu=8000))
    try:
        report = run_phases(path)
    finally:
        lab_cli("fault", "restore", lab_id=lab.lab_id)
    assert not report.ok
    text = messages(report)
    assert "rolled back: spark-b unreachable on enp1s0f1np1" in text, text
    assert "back on its previous network config" in text
    for node in lab.nodes:
        assert link_state(lab, node, "enP2p1s0f1np1")[0] == 9000, node
    assert netplan_text(lab, "spark-a") == before
    monkeypatch.undo()
    converge(lab)
    tally.add("faults survived")


KILL_AFTER_APPLY = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
sys.path.insert(0, {tests!r})
from orchestrator.phases import netguard
from orchestrator.phases import network
from test_up_network import run_phases
netguard.GUARD_SECONDS = {seconds}
def die(self, ctx, change):
    os.kill(os.getpid(), signal.SIGKILL)  # the controller stops between apply and confirm
network.ConfirmFabric.apply = die
run_phases(Path({inventory!r}))
"""


def kill_controller_after_apply(inventory: Path, seconds: int) -> None:
    code = KILL_AFTER_APPLY.format(repo=str(REPO), tests=str(Path(__file__).parent),
                                   seconds=seconds, inventory=str(inventory))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, cwd=REPO)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]


def test_controller_killed_between_apply_and_confirm_converges(lab: Lab, tmp_path: Path) -> None:
    converge(lab)
    path = with_inventory(lab, tmp_path, lambda d: d["fabric"].update(mtu=8000))
    kill_controller_after_apply(path, seconds=120)
    assert link_state(lab, "spark-a", "enp1s0f1np1")[0] == 8000  # applied, not confirmed
    report = run_phases(path)
    assert report.ok, report.to_json()
    assert "confirmed" in messages(report)
    assert lab.exec("spark-a", f"test -e {netguard.GUARD_DIR}/confirmed", check=False).returncode == 0
    converge(lab)


def test_unconfirmed_apply_rolls_back_by_itself_and_rerun_reapplies(lab: Lab, tmp_path: Path) -> None:
    converge(lab)
    path = with_inventory(lab, tmp_path, lambda d: d["fabric"].update(mtu=8000))
    kill_controller_after_apply(path, seconds=2)
    # wait (with a deadline) for the guard to roll back on its own
    lab.exec("spark-a", f"for i in $(seq 150); do test -e {netguard.ROLLED_BACK_PATH} && exit 0; "
             "sleep 0.2; done; exit 1")
    assert link_state(lab, "spark-a", "enp1s0f1np1")[0] == 9000
    report = run_phases(path)
    assert report.ok, report.to_json()
    assert "an earlier apply was rolled back" in messages(report)
    assert link_state(lab, "spark-a", "enp1s0f1np1")[0] == 8000
    converge(lab)


def test_other_port_works_with_matching_inventory_and_fails_preflight_without(lab: Lab) -> None:
    ports = "enp1s0f0np0,enP2p1s0f0np0"
    default_inventory = lab.inventory.read_text()
    lab_cli("up", "--force", "--ports", ports, lab_id=lab.lab_id, check=True)
    try:
        other = Lab.load(lab.lab_id)
        report = run_phases(other.inventory)
        assert report.ok, report.to_json()
        assert link_state(other, "spark-a", "enp1s0f0np0")[0] == 9000
        stale = other.state_dir / "stale-inventory.yml"
        data = yaml.safe_load(default_inventory)
        data["cluster"]["known_hosts"] = str(other.known_hosts)
        data["cluster"]["ssh_key"] = str(other.key)
        stale.write_text(yaml.safe_dump(data))
        report = run_phases(stale)
        assert not report.ok
        assert statuses(report)[("spark-a", "preflight", "checks")] == "failed"
        assert all(step.phase == "preflight" for h in report.hosts.values() for step in h.steps)
        text = messages(report)
        assert "enp1s0f1np1 is Down" in text and "enp1s0f0np0" in text, text
    finally:
        lab_cli("up", "--force", lab_id=lab.lab_id, check=True)




def sparkctl_cli(*args: str, inventory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args, "--inventory", str(inventory)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_issue_20_a_users_file_written_after_a_rollback_survives_down_network(
        lab: Lab, tmp_path: Path) -> None:
    """up (no netplan file before) is rolled back; the user then writes their own file at
    sparkctl's path; neither `up`'s rollback nor `down --network` may delete it."""
    converge(lab)
    down = sparkctl_cli("down", "--network", "--yes", inventory=lab.inventory)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not netplan_text(lab, "spark-a")
    path = with_inventory(lab, tmp_path, lambda d: d["fabric"].update(mtu=8000))
    kill_controller_after_apply(path, seconds=2)
    lab.exec("spark-a", f"for i in $(seq 150); do test -e {netguard.ROLLED_BACK_PATH} && exit 0; "
             "sleep 0.2; done; exit 1")
    assert not netplan_text(lab, "spark-a")  # rolled back: there was no file before
    users = "# Managed by sparkctl (copied by hand)\nnetwork:\n  version: 2\n"
    lab.exec("spark-a", f"umask 077; cat > {NETPLAN_FILE}", input_text=users)
    try:
        down = sparkctl_cli("down", "--network", "--yes", inventory=lab.inventory)
        assert netplan_text(lab, "spark-a") == users, down.stdout
        assert "left alone" in down.stdout, down.stdout
    finally:
        lab.exec("spark-a", f"rm -f {NETPLAN_FILE}")
    converge(lab)
