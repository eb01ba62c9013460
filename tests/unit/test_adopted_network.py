"""`fabric.network: adopted` (issue 36): `up` verifies a network other files give the fabric and
writes no netplan file (its plan's network phase is the verify step, preflight refuses a live
network that does not match), netcheck passes it as adopted, `down --network` leaves it and
says so; the lab lays down a Sync-style file with Sync's numbering."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from conftest import TWO_SPARKS, make_context, make_inventory
from conftest import node_facts as as_facts
from test_preflight import good_facts

from orchestrator.core.plan import build_up_plan
from orchestrator.core.step import Change, RunState, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.netcheck.checks import check_netplan
from orchestrator.phases import adopted, preflight, teardown

SYNC = "/etc/netplan/99-nvidia-sync-cluster.yaml"
IFS = ("enp1s0f1np1", "enP2p1s0f1np1")


def sync_inventory() -> Any:
    data = json.loads(json.dumps(TWO_SPARKS))
    data["fabric"] = {**data.get("fabric", {}), "interfaces": list(IFS), "network": "adopted"}
    for index, node in enumerate(data["nodes"]):
        node["addresses"] = {IFS[0]: f"10.100.32.{index + 1}/24", IFS[1]: f"10.100.33.{index + 1}/24"}
    return make_inventory(data)


INV = sync_inventory()


def definition(address: str, **extra: Any) -> dict[str, Any]:
    return {"section": "ethernets", "addresses": [address], "dhcp4": False, "mtu": 9000, **extra}


def adopted_facts(node: int = 1, mtu: int = 9000, live: str | None = None) -> dict[str, Any]:
    """spark-a (node 1) as Sync left it: its file and the addresses applied."""
    facts = good_facts()
    wanted = {IFS[0]: f"10.100.32.{node}/24", IFS[1]: f"10.100.33.{node}/24"}
    facts["netplan"] = {SYNC: {"interfaces": list(IFS), "definitions": {
        iface: definition(address) for iface, address in wanted.items()}}}
    for iface, address in wanted.items():
        facts["links"][iface] = {**facts["links"][iface], "mtu": mtu,
                                 "addresses": [live if live and iface == IFS[0] else address]}
    return facts


def test_the_plan_verifies_instead_of_writing() -> None:
    phases = {phase.name: phase for phase in build_up_plan(INV).phases}
    assert [step.name for step in phases["network"].steps] == ["adopted"]
    ctx = make_context(INV, "spark-a", {"spark-a": adopted_facts()})
    outcome = adopted.AdoptedNetwork().check(ctx)
    assert isinstance(outcome, Unchanged)
    assert outcome.reason == (f"adopted network ({SYNC}): enp1s0f1np1 10.100.32.1/24, "
                              "enP2p1s0f1np1 10.100.33.1/24, MTU 9000 live; sparkctl writes no "
                              "netplan file")


def test_preflight_passes_the_adopted_file_instead_of_calling_it_a_conflict() -> None:
    ctx = make_context(INV, "spark-a", {"spark-a": adopted_facts()})
    assert isinstance(preflight.PreflightChecks().check(ctx), Unchanged)


@pytest.mark.parametrize(("facts", "said"), [
    (adopted_facts(live="10.100.32.9/24"),
     "enp1s0f1np1 lacks 10.100.32.1/24, which /etc/netplan/99-nvidia-sync-cluster.yaml gives it "
     "(has 10.100.32.9/24): run `sudo netplan apply` on spark-a"),
    (adopted_facts(mtu=1500), "enp1s0f1np1 runs MTU 1500, the inventory says fabric.mtu 9000"),
    (adopted_facts(node=2), "enp1s0f1np1 10.100.32.1/24 is not in a netplan file"),
])
def test_a_network_that_no_longer_matches_is_refused_before_anything(facts: Any, said: str) -> None:
    ctx = make_context(INV, "spark-a", {"spark-a": facts})
    with pytest.raises(SparkctlError) as err:
        preflight.PreflightChecks().check(ctx)
    assert said in str(err.value) and "nothing was changed" in str(err.value)
    with pytest.raises(SparkctlError, match="network/adopted"):
        adopted.AdoptedNetwork().check(ctx)


def test_netcheck_names_the_adopted_file_and_fails_a_missing_address() -> None:
    rows = check_netplan(INV, INV.node("spark-a"), as_facts(adopted_facts()))
    assert [(r.status, r.value) for r in rows] == [("pass", SYNC), ("pass", SYNC)]
    assert rows[0].message.startswith(f"adopted: {SYNC} gives enp1s0f1np1 10.100.32.1/24")
    broken = adopted_facts()
    del broken["netplan"][SYNC]["definitions"][IFS[1]]
    rows = check_netplan(INV, INV.node("spark-a"), as_facts(broken))
    assert [r.status for r in rows] == ["pass", "fail"]


def test_down_network_leaves_the_adopted_network_and_says_so() -> None:
    facts = adopted_facts()
    facts["files"] = {teardown.NETPLAN_FILE: {"exists": False}}
    ctx = make_context(INV, "spark-a", {"spark-a": facts}, shared=RunState())
    outcome = teardown.RemoveNetwork().check(ctx)
    assert isinstance(outcome, Unchanged) and not isinstance(outcome, Change)
    note = (f"spark-a: left alone: the adopted network (fabric.network: adopted): {SYNC} and the "
            "fabric addresses they give; sparkctl did not write them")
    assert note in ctx.shared.notes


def test_the_lab_numbers_addresses_as_sync_does() -> None:
    from sparklab.preconfigured import addresses, netplan_text, sync_address
    from sparklab.topology import build_plan

    assert sync_address("192.168.200.12/24") == "10.100.32.1/24"
    assert sync_address("192.168.205.14/24") == "10.100.37.3/24"
    plan = build_plan("b2b", 2, IFS)
    sync = addresses("sync", plan)
    assert sync[1] == {IFS[0]: "10.100.32.2/24", IFS[1]: "10.100.33.2/24"}
    assert addresses("manual", plan)[0] == {IFS[0]: "192.168.200.12/24", IFS[1]: "192.168.201.12/24"}
    doc = yaml.safe_load(netplan_text("sync", sync[0]))
    assert doc["network"]["ethernets"][IFS[1]] == {"dhcp4": False, "mtu": 9000,
                                                   "addresses": ["10.100.33.1/24"]}
