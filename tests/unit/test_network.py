"""Network phase: faked facts in, Change/commands out; the netplan render against a golden file."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from conftest import node_facts as parsed_facts

from orchestrator.core.step import Change, NodeContext, RunOptions, RunState, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.inventory_checks import inventory_from_data
from orchestrator.paths import NETPLAN_FILE
from orchestrator.phases import netguard, network
from orchestrator.remote.transport import Result
from orchestrator.render import sha256

GOLDEN = Path(__file__).parent / "golden" / "netplan-spark-a.yaml"
INVENTORY = inventory_from_data(
    {"cluster": {"name": "two-sparks", "ssh_key": "/k"},
     "nodes": [{"name": "spark-a", "host": "a"}, {"name": "spark-b", "host": "b"}]},
    "inv.yml",
)
NODE_A = INVENTORY.nodes[0]


def link(addresses: list[str], mtu: int = 9000) -> dict[str, Any]:
    return {"operstate": "UP", "up": True, "carrier": True, "mtu": mtu, "addresses": addresses}


def facts(netplan_content: str | None = None, mode: int = 0o600, **extra: Any) -> dict[str, Any]:
    files: dict[str, Any] = {path: {"exists": False} for path in network.network_request(
        INVENTORY, NODE_A)["files"]}
    if netplan_content is not None:
        files[NETPLAN_FILE] = {"exists": True, "mode": mode, "sha256": sha256(netplan_content),
                                        "content": netplan_content}
    out: dict[str, Any] = {
        "files": files,
        "netplan": {},
        "links": {"eth0": link(["10.0.0.11/24"], 1500),
                  "enp1s0f1np1": link(["192.168.200.12/24"]),
                  "enP2p1s0f1np1": link(["192.168.201.12/24"])},
    }
    out.update(extra)
    return out


def ctx(node_facts: dict[str, Any], transport: Any = None, shared: RunState | None = None,
        dry_run: bool = False) -> NodeContext:
    facts = parsed_facts(node_facts, "spark-a")
    return NodeContext(INVENTORY, NODE_A, facts, {"spark-a": facts}, transport,
                       RunOptions(dry_run=dry_run), shared if shared is not None else RunState())


def test_render_matches_golden_file() -> None:
    assert network.render_netplan(INVENTORY, NODE_A) == GOLDEN.read_text()


def test_render_has_header_mtu_and_no_dhcp_and_only_fabric_interfaces() -> None:
    text = network.render_netplan(INVENTORY, NODE_A)
    assert text.startswith("# Managed by sparkctl")
    assert text.count("mtu: 9000") == 2 and "dhcp4: false" in text and "link-local: []" in text
    assert "enP7s7" not in text


def test_missing_file_is_written_with_backup_and_diff() -> None:
    outcome = network.NetplanFile().check(ctx(facts()))
    assert isinstance(outcome, Change)
    assert outcome.summary.startswith("write /etc/netplan/40-sparkctl-fabric.yaml")
    assert "+      mtu: 9000" in outcome.diff
    assert outcome.payload == GOLDEN.read_text()


def test_same_content_and_mode_is_unchanged() -> None:
    outcome = network.NetplanFile().check(ctx(facts(GOLDEN.read_text())))
    assert isinstance(outcome, Unchanged)


def test_wrong_mode_only_is_a_chmod_change() -> None:
    outcome = network.NetplanFile().check(ctx(facts(GOLDEN.read_text(), mode=0o644)))
    assert isinstance(outcome, Change) and outcome.summary.startswith("chmod 600")


def test_other_netplan_files_defining_our_interfaces_are_reported_not_touched() -> None:
    node_facts = facts(GOLDEN.read_text())
    node_facts["netplan"] = {
        "/etc/netplan/40-cx7.yaml": {"exists": True, "interfaces": ["enp1s0f1np1"]},
        "/etc/netplan/01-mgmt.yaml": {"exists": True, "interfaces": ["enP7s7"]},
        NETPLAN_FILE: {"exists": True, "interfaces": ["enp1s0f1np1", "enP2p1s0f1np1"]},
    }
    outcome = network.NetplanFile().check(ctx(node_facts))
    assert isinstance(outcome, Unchanged)
    assert "WARNING: /etc/netplan/40-cx7.yaml also defines enp1s0f1np1" in outcome.reason
    assert "01-mgmt" not in outcome.reason


def test_write_command_validates_before_installing_through_the_ledger() -> None:
    command = netguard.write_netplan_cmd()
    assert command.index("netplan generate --root-dir") < command.index("install ")
    assert "netplan-backup.absent" in command and "netplan-confirmed.sha256" in command


def test_live_state_matching_is_unchanged() -> None:
    assert isinstance(network.NetplanApply().check(ctx(facts())), Unchanged)


def test_mtu_drift_is_applied_with_a_guard_that_knows_the_old_mtu() -> None:
    node_facts = facts()
    node_facts["links"]["enp1s0f1np1"]["mtu"] = 1500
    node_facts["links"]["enP2p1s0f1np1"]["addresses"] = []
    outcome = network.NetplanApply().check(ctx(node_facts))
    assert isinstance(outcome, Change)
    assert "enp1s0f1np1: mtu 1500 -> 9000" in outcome.diff
    assert "enP2p1s0f1np1: add 192.168.201.12/24" in outcome.diff
    config: netguard.ArmConfig = outcome.payload
    assert config.added == [("enP2p1s0f1np1", "192.168.201.12/24")]
    assert config.previous_mtu == {"enp1s0f1np1": 1500, "enP2p1s0f1np1": 9000}


def test_pending_guard_of_an_interrupted_run_gets_confirmed() -> None:
    node_facts = facts()
    node_facts["files"][netguard.ARMED_PATH] = {"exists": True}
    shared = RunState()
    outcome = network.NetplanApply().check(ctx(node_facts, shared=shared))
    assert isinstance(outcome, Unchanged) and "confirmed below" in outcome.reason
    assert shared.netplan_to_confirm == {"spark-a"}
    node_facts["files"][netguard.DECIDED_PATH] = {"exists": True}
    shared = RunState()
    network.NetplanApply().check(ctx(node_facts, shared=shared))
    assert shared == RunState()


def test_missing_fabric_interface_fails_apply_check() -> None:
    node_facts = facts()
    del node_facts["links"]["enP2p1s0f1np1"]
    with pytest.raises(SparkctlError, match="enP2p1s0f1np1 does not exist"):
        network.NetplanApply().check(ctx(node_facts))


def test_peer_checks_b2b_and_ring() -> None:
    checks = netguard.peer_checks(INVENTORY, NODE_A)
    assert [(c.interface, c.peer, c.address) for c in checks] == [
        ("enp1s0f1np1", "spark-b", "192.168.200.13"), ("enP2p1s0f1np1", "spark-b", "192.168.201.13")]
    ring = inventory_from_data({
        "cluster": {"name": "r", "ssh_key": "/k"},
        "fabric": {"interfaces": ["p0", "p1"], "topology": "ring"},
        "nodes": [
            {"name": "a", "host": "a", "addresses": {"p0": "10.0.1.1/24", "p1": "10.0.3.1/24"}},
            {"name": "b", "host": "b", "addresses": {"p0": "10.0.2.2/24", "p1": "10.0.1.2/24"}},
            {"name": "c", "host": "c", "addresses": {"p0": "10.0.3.3/24", "p1": "10.0.2.3/24"}},
        ]}, "ring.yml")
    got = [(c.interface, c.peer, c.address) for c in netguard.peer_checks(ring, ring.nodes[0])]
    assert got == [("p0", "b", "10.0.1.2"), ("p1", "c", "10.0.3.3")]


class GuardTransport:
    """Answers the guard's confirm command with a canned JSON line; records commands."""

    def __init__(self, answer: dict[str, Any], status: int = 0) -> None:
        self.node = "spark-a"
        self.answer = answer
        self.status = status
        self.commands: list[tuple[str, str]] = []

    def run(self, command: str, *, stdin: Any = None, sudo: bool = False, timeout: Any = None,
            display: Any = None) -> Result:
        self.commands.append((command, stdin))
        return Result(self.node, display or command, self.status, json.dumps(self.answer), "", 0.0)

    def close(self) -> None:
        pass


def test_confirm_skips_nodes_not_applied() -> None:
    transport = GuardTransport({})
    message = network.ConfirmFabric().apply(ctx(facts(), transport), Change("verify"))
    assert "nothing to confirm" in (message or "") and transport.commands == []


def test_confirm_sends_the_guard_on_stdin_with_every_peer() -> None:
    transport = GuardTransport({"outcome": "confirmed"})
    shared = RunState(netplan_to_confirm={"spark-a"})
    message = network.ConfirmFabric().apply(ctx(facts(), transport, shared), Change("verify"))
    assert "confirmed" in (message or "")
    command, stdin = transport.commands[0]
    assert stdin == netguard.guard_script() and "netguard" not in command.split("python3 -")[0]
    config = json.loads(shlex.split(command.split("; ", 1)[1])[-1])
    assert {c["address"] for c in config["checks"]} == {"192.168.200.13", "192.168.201.13"}
    assert config["sha"] == sha256(GOLDEN.read_text())


def test_confirm_failure_reports_rollback_and_reason() -> None:
    transport = GuardTransport({
        "outcome": "rolled-back",
        "failures": [{"interface": "enp1s0f1np1", "peer": "spark-b", "address": "192.168.200.13"}],
        "rollback": {"restored": "restored the previous netplan file", "apply_rc": 0},
    }, status=1)
    shared = RunState(netplan_to_confirm={"spark-a"})
    with pytest.raises(SparkctlError) as err:
        network.ConfirmFabric().apply(ctx(facts(), transport, shared), Change("verify"))
    text = str(err.value)
    assert "rolled back: spark-b unreachable on enp1s0f1np1" in text
    assert "back on its previous network config" in text


def test_guard_script_is_python38_compatible() -> None:
    import ast

    ast.parse(netguard.guard_script(), feature_version=(3, 8))


def test_a_users_file_at_our_path_is_replaced_only_with_a_note_that_it_is_kept() -> None:
    from orchestrator.paths import LEDGER

    node_facts = facts("network: {version: 2}\n")
    node_facts["files"][LEDGER] = {"exists": False}
    outcome = network.NetplanFile().check(ctx(node_facts))
    assert isinstance(outcome, Change) and outcome.summary.startswith("replace")
    assert "not written by sparkctl: it is kept" in outcome.summary
