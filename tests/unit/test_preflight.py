"""Preflight: faked facts in, every problem of a node listed at once."""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import node_facts

from orchestrator.core.step import NodeContext, RunOptions, RunState, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.inventory_checks import inventory_from_data
from orchestrator.phases import preflight

INVENTORY = inventory_from_data(
    {"cluster": {"name": "two-sparks", "ssh_key": "/k"},
     "nodes": [{"name": "spark-a", "host": "spark-a.local"}, {"name": "spark-b", "host": "b"}]},
    "inv.yml",
)
NODE = INVENTORY.nodes[0]
IMAGE = INVENTORY.container.image


def ok(out: str = "") -> dict[str, Any]:
    return {"rc": 0, "out": out, "err": ""}


def good_facts() -> dict[str, Any]:
    link = {"operstate": "UP", "up": True, "carrier": True, "mtu": 1500, "addresses": []}
    return {
        "time": time.time(),
        "python": [3, 12, 3],
        "resolve": {"spark-a.local": ["10.0.0.11"]},
        "links": {"enP7s7": {**link, "addresses": ["10.0.0.11/24"]},
                  "enp1s0f1np1": dict(link), "enP2p1s0f1np1": dict(link),
                  "enp1s0f0np0": {**link, "operstate": "DOWN", "carrier": False}},
        "ibdev2netdev": {"rc": 0, "err": "", "devices": {
            "enp1s0f0np0": {"device": "rocep1s0f0", "state": "Down"},
            "enp1s0f1np1": {"device": "rocep1s0f1", "state": "Up"},
            "enP2p1s0f1np1": {"device": "roceP2p1s0f1", "state": "Up"},
        }},
        "images": {IMAGE: {"Id": "sha256:abc", "RepoDigests": [f"{IMAGE}@sha256:0123456789abcdef"]}},
        "disk": {"/var/lib/docker": {"free_bytes": 500 * 10**9, "checked": "/var/lib/docker"}},
        "commands": {"docker": ok("27.3.1\n"), "groups": ok("nvidia adm sudo docker\n"),
                     "netplan": ok("/usr/sbin/netplan\n")},
    }


def check(facts: dict[str, Any]) -> Any:
    parsed = node_facts(facts, NODE.name)
    ctx = NodeContext(INVENTORY, NODE, parsed, {NODE.name: parsed}, None, RunOptions(), RunState())
    return preflight.PreflightChecks().check(ctx)


def test_request_asks_for_everything_in_one_round_trip() -> None:
    request = preflight.preflight_request(INVENTORY, NODE)
    assert request["resolve"] == ["spark-a.local"] and request["images"] == [IMAGE]
    assert request["links"] and request["ibdev2netdev"] and request["disk"] == ["/var/lib/docker"]
    assert "'nvidia'" in request["commands"]["groups"] or "nvidia" in request["commands"]["groups"]


def test_healthy_node_passes_with_notes() -> None:
    outcome = check(good_facts())
    assert isinstance(outcome, Unchanged)
    assert "docker 27.3.1" in outcome.reason and "management on enP7s7" in outcome.reason
    assert "image present" in outcome.reason


def test_every_problem_is_listed_at_once() -> None:
    facts = good_facts()
    facts["commands"]["docker"] = {"rc": 1, "out": "", "err": "Cannot connect to the Docker daemon"}
    facts["commands"]["groups"] = ok("nvidia adm sudo\n")
    facts["commands"]["netplan"] = {"rc": 1, "out": "", "err": ""}
    facts["disk"]["/var/lib/docker"]["free_bytes"] = 3 * 10**9
    facts["ibdev2netdev"]["devices"]["enP2p1s0f1np1"]["state"] = "Down"
    with pytest.raises(SparkctlError) as err:
        check(facts)
    text = str(err.value)
    assert "5 problem(s); nothing was changed" in text
    for expected in ("docker is not usable", "not in the docker group", "netplan is not installed",
                     "only 3.0 GB free", "enP2p1s0f1np1 is Down"):
        assert expected in text


def test_down_port_names_the_cabled_ports() -> None:
    facts = good_facts()
    devices = facts["ibdev2netdev"]["devices"]
    devices["enp1s0f1np1"]["state"] = "Down"
    devices["enp1s0f0np0"]["state"] = "Up"
    with pytest.raises(SparkctlError, match=r"is the QSFP cable in this port\? ports with a cable "
                                            r"\(ibdev2netdev Up\): enP2p1s0f1np1, enp1s0f0np0"):
        check(facts)


def test_missing_interface_is_named_with_what_exists() -> None:
    facts = good_facts()
    del facts["links"]["enP2p1s0f1np1"]
    with pytest.raises(SparkctlError, match="enP2p1s0f1np1 does not exist"):
        check(facts)


def test_management_connection_over_a_fabric_interface_is_refused() -> None:
    facts = good_facts()
    facts["links"]["enp1s0f1np1"]["addresses"] = ["10.0.0.11/24"]
    facts["links"]["enP7s7"]["addresses"] = []
    with pytest.raises(SparkctlError, match="runs over fabric interface enp1s0f1np1"):
        check(facts)


def test_unknown_management_interface_is_only_a_note() -> None:
    facts = good_facts()
    facts["resolve"] = {"spark-a.local": []}
    outcome = check(facts)
    assert isinstance(outcome, Unchanged) and "could not tell the management interface" in outcome.reason


def test_clock_skew_warns_but_passes() -> None:
    facts = good_facts()
    facts["time"] = time.time() - 600
    outcome = check(facts)
    assert isinstance(outcome, Unchanged) and "WARNING: clock is" in outcome.reason


def test_missing_image_is_noted_not_failed() -> None:
    facts = good_facts()
    facts["images"] = {IMAGE: None}
    outcome = check(facts)
    assert isinstance(outcome, Unchanged) and "not present yet" in outcome.reason


def test_without_ibdev2netdev_carrier_decides() -> None:
    facts = good_facts()
    facts["ibdev2netdev"] = {"rc": 127, "devices": {}, "err": "command not found"}
    assert isinstance(check(facts), Unchanged)
    facts["links"]["enp1s0f1np1"]["carrier"] = False
    with pytest.raises(SparkctlError, match="has no carrier"):
        check(facts)
