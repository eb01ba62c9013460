"""Preflight finds other netplan files that address the fabric interfaces (issue 20 item 7):
golden /etc/netplan trees read by the real gatherer, judged by phases/netplan_conflicts.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import make_inventory, node_facts
from conftest import node_facts as as_facts
from nodescript import run_node_script
from test_preflight import good_facts

from orchestrator.errors import SparkctlError
from orchestrator.paths import NETPLAN_FILE
from orchestrator.phases import preflight
from orchestrator.phases.netplan_conflicts import conflict_problems, conflicts

GOLDEN = Path(__file__).parent / "golden" / "netplan-conflicts"
INV = make_inventory()
NODE = INV.node("spark-a")


def netplan_fact(tree: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The gatherer's `netplan` fact for a golden tree, as if it were /etc/netplan."""
    directory = GOLDEN / tree
    ran = run_node_script("gather.py", [json.dumps({"netplan": True})], monkeypatch,
                          replace={'directory="/etc/netplan"': f'directory="{directory}"'})
    found = ran.json["netplan"]
    return {path.replace(str(directory), "/etc/netplan"): fact for path, fact in found.items()}


def problems(tree: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return conflict_problems(INV, NODE, as_facts({"netplan": netplan_fact(tree, monkeypatch)}))


def test_nvidias_addressing_in_another_file_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    found = problems("nvidia-playbook", monkeypatch)
    assert len(found) == 1
    text = found[0]
    assert text.startswith("/etc/netplan/01-spark-fabric.yaml already configures the fabric: "
                           "enp1s0f1np1: 192.168.100.10/24; enP2p1s0f1np1: 192.168.100.11/24 "
                           "(enp1s0f1np1, enP2p1s0f1np1 share 192.168.100.0/24")
    assert "sets enP2p1s0f1np1 192.168.201.12/24, enp1s0f1np1 192.168.200.12/24" in text
    assert ("Fix on spark-a: delete it (it holds nothing else): "
            "`sudo rm /etc/netplan/01-spark-fabric.yaml`") in text
    assert "then `sudo netplan apply`" in text and "the `addresses:` of node spark-a" in text
    assert NETPLAN_FILE not in [path for path, _, _ in conflicts(
        INV, NODE, as_facts({"netplan": netplan_fact("nvidia-playbook", monkeypatch)}))]


def test_a_shared_file_keeps_its_other_definitions(monkeypatch: pytest.MonkeyPatch) -> None:
    text = problems("cloud-init", monkeypatch)[0]
    assert "/etc/netplan/50-cloud-init.yaml already configures the fabric: " \
           "enp1s0f1np1: 192.168.100.10/24, dhcp6: true." in text
    assert "remove enp1s0f1np1 from it (keep enP7s7)" in text
    assert "share" not in text


def test_harmless_mentions_and_our_own_file_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    fact = netplan_fact("harmless", monkeypatch)
    assert fact[NETPLAN_FILE]["definitions"]["enp1s0f1np1"]["addresses"] == ["192.168.200.12/24"]
    assert fact["/etc/netplan/50-cloud-init.yaml"]["definitions"]["enp1s0f1np1"]["dhcp4"] is False
    assert problems("harmless", monkeypatch) == []


def test_match_rules_count_by_name_glob_not_by_mac(monkeypatch: pytest.MonkeyPatch) -> None:
    text = problems("match-glob", monkeypatch)[0]
    assert ("enp1s0f1np1 (as cx7-port1): dhcp4: true; enP2p1s0f1np1 (as cx7-port1): dhcp4: true"
            in text)
    assert "by-mac" in text and "keep by-mac" in text


def test_preflight_fails_before_anything_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "netplan" in preflight.preflight_request(INV, NODE)
    facts = good_facts()
    facts["netplan"] = netplan_fact("nvidia-playbook", monkeypatch)
    found, _ = preflight.preflight_problems(INV, NODE, as_facts(facts), now=facts.get("time"))
    assert any("01-spark-fabric.yaml already configures the fabric" in p for p in found)
    from orchestrator.core.step import NodeContext, RunOptions, RunState

    parsed = node_facts(facts, "spark-a")
    context = NodeContext(inventory=INV, node=NODE, facts=parsed, cluster_facts={"spark-a": parsed},
                          transport=None, options=RunOptions(), shared=RunState())
    with pytest.raises(SparkctlError, match="nothing was changed"):
        preflight.PreflightChecks().check(context)
