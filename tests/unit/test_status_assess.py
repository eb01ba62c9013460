"""More of status/assess.py: gathering over the fake cluster, and the assessment's less common
verdicts (missing interfaces, wrong MTU, inspect errors, old images, mixed images, half-set-up
fabric, unreadable records, cluster states, timestamps)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import FakeCluster, cluster_of
from conftest import node_facts as as_facts
from test_status import INVENTORY, NOW, SERVER, node_facts

from orchestrator.errors import SparkctlError
from orchestrator.paths import NETPLAN_FILE, SERVER_JSON
from orchestrator.status import assess as status
from orchestrator.status import nodes as node_status

BOTH = ("spark-a", "spark-b")


def assess(facts: dict[str, dict[str, Any]], errors: dict[str, str] | None = None) -> dict[str, Any]:
    return status.assess(INVENTORY, cluster_of(facts), errors or {})


def test_gather_status_asks_every_reachable_node_once(fake_cluster: Callable[..., FakeCluster],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = fake_cluster(INVENTORY, facts={"spark-a": node_facts("spark-a")},
                           unreachable={"spark-b": "connection refused"})
    monkeypatch.setattr("orchestrator.remote.connect.connect_all", cluster.connect_all)

    result = status.gather_status(INVENTORY)

    assert not result["ok"] and result["state"] == "degraded"
    assert result["nodes"]["spark-a"]["state"] == "up"
    assert result["nodes"]["spark-b"]["problems"] == ["unreachable: connection refused"]
    (call,) = cluster["spark-a"].calls
    assert call.sudo and call.timeout == 90
    assert call.request == json.loads(json.dumps(status.status_facts(INVENTORY, INVENTORY.node("spark-a"))))
    assert result["seconds"] >= 0
    assert cluster["spark-a"].closed  # the session closed its connections


def test_gather_status_reports_a_node_whose_gatherer_failed(fake_cluster: Callable[..., FakeCluster],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = fake_cluster(INVENTORY, facts={"spark-a": node_facts("spark-a"),
                                             "spark-b": (0, "python3: not found", "")})
    monkeypatch.setattr("orchestrator.remote.connect.connect_all", cluster.connect_all)

    result = status.gather_status(INVENTORY)

    assert result["nodes"]["spark-b"]["state"] == "unreachable"
    assert "the facts gatherer printed no JSON" in result["nodes"]["spark-b"]["problems"][0]
    assert result["nodes"]["spark-a"]["reachable"]


def test_interfaces_missing_without_address_or_with_the_wrong_mtu() -> None:
    facts = {n: node_facts(n) for n in BOTH}
    del facts["spark-a"]["links"]["enp1s0f1np1"]
    facts["spark-b"]["links"]["enp1s0f1np1"]["mtu"] = 1500
    result = assess(facts)
    a, b = result["nodes"]["spark-a"], result["nodes"]["spark-b"]
    assert a["network"]["interfaces"]["enp1s0f1np1"] == {
        "state": "missing", "addresses": [], "mtu": None, "expected": "192.168.200.12/24", "ok": False}
    assert a["problems"] == ["fabric interface enp1s0f1np1 does not exist"]
    assert b["problems"] == ["enp1s0f1np1 MTU is 1500, want 9000"]
    assert not b["network"]["interfaces"]["enp1s0f1np1"]["ok"]

    facts = {n: node_facts(n) for n in BOTH}
    facts["spark-b"]["links"]["enp1s0f1np1"]["addresses"] = []
    facts["spark-b"]["links"]["enp1s0f1np1"]["mtu"] = 1500  # the address is the first thing to fix
    assert assess(facts)["nodes"]["spark-b"]["problems"] == [
        "enp1s0f1np1 lacks its address 192.168.200.13/24 (run `sparkctl up`)"]


def test_an_unconfigured_node_has_no_fabric_complaints_but_half_a_cluster_has() -> None:
    facts = {n: node_facts(n, configured=False, container=None) for n in BOTH}
    del facts["spark-a"]["links"]["enp1s0f1np1"]
    assert assess(facts)["ok"]

    facts = {"spark-a": node_facts("spark-a", container=None),
             "spark-b": node_facts("spark-b", configured=False, container=None)}
    result = assess(facts)
    assert result["nodes"]["spark-a"]["state"] == "network-only"
    assert result["nodes"]["spark-b"]["problems"] == [
        "fabric not configured here while other nodes have it (run `sparkctl up`)"]
    assert result["state"] == "degraded"


def test_inspect_errors_and_an_old_image() -> None:
    facts = {n: node_facts(n) for n in BOTH}
    facts["spark-a"]["containers"]["trtllm-multinode"] = {"error": "permission denied"}
    facts["spark-b"]["images"][INVENTORY.container.image]["Id"] = "sha256:newer"
    result = assess(facts)
    assert result["nodes"]["spark-a"]["container"]["status"] == "unknown"
    assert result["nodes"]["spark-a"]["problems"] == [
        "docker inspect trtllm-multinode failed: permission denied"]
    b = result["nodes"]["spark-b"]
    assert b["container"]["image_current"] is False
    assert b["problems"] == [
        "container trtllm-multinode runs an old configuration or image (run `sparkctl up`)"]


def test_containers_on_different_images_are_a_problem_everywhere() -> None:
    facts = {n: node_facts(n) for n in BOTH}
    facts["spark-b"]["containers"]["trtllm-multinode"]["Image"] = "sha256:other"
    facts["spark-b"]["images"][INVENTORY.container.image]["Id"] = "sha256:other"
    result = assess(facts)
    problem = "containers run different images: spark-a -> sha256:img, spark-b -> sha256:other"
    for name in BOTH:
        assert result["nodes"][name]["problems"] == [problem]
        assert result["nodes"][name]["state"] == "problem"


def test_when_the_container_spec_cannot_be_computed_the_config_is_unknown() -> None:
    from dataclasses import replace

    from orchestrator.engines import up_container

    def no_spec(ctx: object) -> object:
        raise SparkctlError("no ibdev2netdev")

    up = up_container(INVENTORY)
    assert up is not None
    facts = node_facts("spark-a")
    assert node_status.desired_config_hash(replace(up, spec_for=no_spec), INVENTORY,  # type: ignore[arg-type]
                                      INVENTORY.node("spark-a"), facts) is None
    both = {n: node_facts(n) for n in BOTH}
    del both["spark-a"]["ibdev2netdev"]  # the container step needs the RoCE devices
    assert assess(both)["nodes"]["spark-a"]["container"]["config"] == "unknown"


def test_unreadable_server_records_and_probe_answers() -> None:
    facts = {n: node_facts(n, server=SERVER) for n in BOTH}
    facts["spark-a"]["files"][SERVER_JSON]["content"] = "{truncated"
    facts["spark-a"]["commands"]["probe"]["out"] = "Traceback (most recent call last):"
    server = assess(facts)["server"]
    assert server["model"] is None and server["port"] is None and server["uptime_seconds"] is None
    assert server["health"] == {"error": "the health probe printed no JSON"}
    assert server["state"] == "down"
    assert server["problem"] == ("server not answering on port None (the health probe printed no JSON): "
                                 "crashed? see `sparkctl logs`")
    assert status.assess_server(INVENTORY, None, {}) is None


def test_a_server_recorded_with_the_head_container_stopped_is_down() -> None:
    facts = {"spark-a": node_facts("spark-a", container="exited", server=SERVER,
                                   probe={"/health": 200, "/health_generate": 200}),
             "spark-b": node_facts("spark-b")}
    result = assess(facts)
    assert result["server"]["state"] == "down"
    assert ("server qwen3 (trtllm): server recorded but the head container is not running"
            in result["nodes"]["spark-a"]["problems"])


@pytest.mark.parametrize(("container_started", "pids", "restarted"), [
    ("2025-06-15T14:05:00.123456789Z", {}, True),  # restarted five minutes after the server
    ("2025-06-15T14:00:03.5Z", {}, False),  # within the clock margin: not a restart
    ("2025-06-15T13:50:00Z", {}, False),  # started before the server, as after `up`
    ("2025-06-15T14:05:00Z", {"vllm.pid": {"pid": 9, "alive": True}}, False),  # server runs
    ("0001-01-01T00:00:00Z", {}, False),  # docker's "never started"
    ("2025-06-15T14:05:00Z", {}, None),  # restarted, and a server answers again (--persist)
])
def test_a_head_container_restarted_after_the_server_started_is_named(
        container_started: str, pids: dict[str, Any], restarted: bool | None) -> None:
    server = {**SERVER, "main": "vllm.pid"}
    probe = {"/health": 200, "/health_generate": 200} if restarted is None else {"error": "refused"}
    facts = {n: node_facts(n, server=SERVER if n == "spark-a" else None, probe=probe) for n in BOTH}
    facts["spark-a"]["files"][SERVER_JSON]["content"] = json.dumps(server)
    facts["spark-a"]["commands"]["server_container"] = {"rc": 0,
                                                        "out": f"/sparkctl-vllm {container_started}\n"}
    facts["spark-a"]["commands"]["processes"] = {"rc": 0, "out": json.dumps({"pids": pids})}
    result = assess(facts)["server"]
    if restarted:
        assert result["state"] == "down"
        assert result["problem"].startswith("the head's container sparkctl-vllm restarted at ")
        assert result["problem"].endswith(
            "the server did not come back with it: run `sparkctl launch qwen3 --port 8355` again")
    else:
        assert "restarted" not in result["problem"]
        assert result["state"] == ("healthy" if restarted is None else "down")


def test_process_answers_that_cannot_be_read_are_no_processes() -> None:
    facts = node_facts("spark-a")
    facts["commands"]["processes"] = {"rc": 0, "out": "not json"}
    assert status.server_processes(as_facts(facts)) == {}
    facts["commands"]["processes"] = {"rc": 0, "out": "[1, 2]"}
    assert status.server_processes(as_facts(facts)) == {}
    facts["commands"]["processes"] = {"rc": 1, "out": json.dumps({"pids": {"x.pid": {}}})}
    assert status.server_processes(as_facts(facts)) == {}
    facts["commands"]["processes"] = {"rc": 0, "out": json.dumps({"pids": {"x.pid": {"pid": 1}}})}
    assert status.server_processes(as_facts(facts)) == {"x.pid": {"pid": 1}}


@pytest.mark.parametrize(("states", "server", "expected"), [
    ({"up"}, None, "up"),
    ({"up"}, {"state": "healthy"}, "serving"),
    ({"up"}, {"state": "starting"}, "up"),
    ({"up", "problem"}, None, "degraded"),
    ({"network-only", "not-set-up"}, None, "network-only"),
    ({"not-set-up"}, None, "not-set-up"),
    ({"up", "network-only"}, None, "partial"),
])
def test_cluster_state(states: set[str], server: dict[str, Any] | None, expected: str) -> None:
    nodes = {f"n{i}": {"state": state} for i, state in enumerate(sorted(states))}
    assert status.cluster_state(nodes, server) == expected


@pytest.mark.parametrize(("iso", "age"), [
    ("2025-06-15T14:00:00Z", int(NOW - 1749996000)),
    ("2025-06-15T14:00:00.123456789+00:00", int(NOW - 1749996000.123456)),
    ("2025-06-15T14:00:00.5Z", int(NOW - 1749996000.5)),
    ("2030-01-01T00:00:00Z", 0),  # a clock ahead of the node's: never negative
    ("0001-01-01T00:00:00Z", None),  # docker's "never started"
    ("2025-06-15T14:00:00", None),  # no zone: cannot be compared
    ("yesterday", None),
    ("", None),
    (None, None),
])
def test_ages_from_docker_and_server_timestamps(iso: str | None, age: int | None) -> None:
    assert node_status.age(iso, NOW) == age


def test_the_server_list_comes_from_the_same_round_trip() -> None:
    """status asks each node for its servers in the facts request (no second SSH session)."""
    request = status.status_facts(INVENTORY, INVENTORY.node("spark-b"))
    from orchestrator.engines.servers import servers_cmd
    assert request["commands"]["servers"] == servers_cmd(INVENTORY, INVENTORY.node("spark-b"), probe=True)
    listing = {"servers": [{"name": "q36", "engine": "sglang", "port": 30000, "alive": True,
                            "health": 503, "nodes": ["spark-b"], "model": "Qwen/Qwen3.6-27B-FP8"}]}
    facts = {n: node_facts(n) for n in BOTH}
    facts["spark-b"]["commands"]["servers"] = {"rc": 0, "out": json.dumps(listing)}
    (server,) = status.server_list(INVENTORY, cluster_of(facts))
    assert (server["name"], server["engine"], server["state"], server["node"]) == (
        "q36", "sglang", "loading", "spark-b")


def test_the_recorded_server_has_one_verdict_in_status_and_in_the_servers_list() -> None:
    """A server an earlier sparkctl launched (its single record migrated) that status also
    assessed in full (the read that migrated it saw the old record too): the servers list
    carries that verdict (a dead rank, a restarted container), not a second one."""
    listing = {"servers": [{"name": "qwen3", "engine": "trtllm", "port": 8355, "alive": True,
                            "health": 200, "nodes": ["spark-a"], "model": "Qwen/Qwen3",
                            "migrated_from": "/var/lib/sparkctl/run/server.json"}]}
    facts = {n: node_facts(n) for n in BOTH}
    facts["spark-a"]["commands"]["servers"] = {"rc": 0, "out": json.dumps(listing)}
    (entry,) = status.server_list(INVENTORY, cluster_of(facts), {"state": "dead"})
    assert entry["state"] == "dead"
    (entry,) = status.server_list(INVENTORY, cluster_of(facts), {"state": "starting"})
    assert entry["state"] == "loading"
    (entry,) = status.server_list(INVENTORY, cluster_of(facts))  # nothing assessed: its own probe
    assert entry["state"] == "healthy"


def test_an_adopted_network_counts_as_configured_without_sparkctls_file() -> None:
    """fabric.network: adopted (issue 36): NVIDIA Sync's file holds the network, not sparkctl's."""
    adopted = INVENTORY.model_copy(update={"fabric": INVENTORY.fabric.model_copy(
        update={"network": "adopted"})})
    facts = node_facts("spark-a", container=None)  # addresses live, from Sync's file
    facts["files"][NETPLAN_FILE] = {"exists": False}
    alone = node_status.assess_node(INVENTORY, INVENTORY.node("spark-a"), as_facts(facts))
    assert alone["state"] == "not-set-up"
    found = node_status.assess_node(adopted, adopted.node("spark-a"), as_facts(facts))
    assert found["state"] == "network-only" and found["network"]["configured"] is True
