"""Inventory validation: each rule, with the message a user sees."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.errors import InputError
from orchestrator.inventory_checks import inventory_from_data, load_inventory, resolve_inventory_path

REPO = Path(__file__).resolve().parents[2]

BASE: dict[str, Any] = {
    "cluster": {"name": "two-sparks", "user": "nvidia", "ssh_key": "/k", "management_interface": "enP7s7"},
    "fabric": {"interfaces": ["enp1s0f1np1", "enP2p1s0f1np1"], "mtu": 9000},
    "nodes": [
        {"name": "spark-a", "host": "10.0.0.1",
         "addresses": {"enp1s0f1np1": "192.168.200.12/24", "enP2p1s0f1np1": "192.168.201.12/24"}},
        {"name": "spark-b", "host": "10.0.0.2",
         "addresses": {"enp1s0f1np1": "192.168.200.13/24", "enP2p1s0f1np1": "192.168.201.13/24"}},
    ],
}


def load(mutate: Any = None) -> Any:
    data = copy.deepcopy(BASE)
    if mutate:
        mutate(data)
    return inventory_from_data(data, "inv.yml")


def error_of(mutate: Any) -> str:
    with pytest.raises(InputError) as info:
        load(mutate)
    assert info.value.exit_code == 2
    return str(info.value)


def test_shipped_inventory_is_valid() -> None:
    inventory = load_inventory(REPO / "inventories" / "two-sparks.yml")
    assert inventory.head_name == "spark-a"
    assert inventory.fabric_address(inventory.nodes[1]) == "192.168.200.13"
    assert inventory.topology == "b2b"


def test_unknown_key_is_named_with_its_path() -> None:
    message = error_of(lambda d: d["nodes"][1].update({"adresses": {}}))
    assert "inv.yml" in message
    assert "nodes[1] (spark-b).adresses: unknown key" in message


def test_missing_cluster_name() -> None:
    message = error_of(lambda d: d["cluster"].pop("name"))
    assert "cluster.name: required key is missing" in message


def test_duplicate_node_names_and_hosts() -> None:
    def same(d: dict[str, Any]) -> None:
        d["nodes"][1]["name"] = "spark-a"
        d["nodes"][1]["host"] = "10.0.0.1"

    message = error_of(same)
    assert "nodes[].name: 'spark-a' appears more than once" in message
    assert "nodes[].host: '10.0.0.1' appears more than once" in message


def test_duplicate_fabric_address() -> None:
    message = error_of(lambda d: d["nodes"][1]["addresses"].update({"enp1s0f1np1": "192.168.200.12/24"}))
    assert "'192.168.200.12' appears more than once" in message


def test_twins_sharing_a_subnet_are_refused() -> None:
    message = error_of(lambda d: d["nodes"][0]["addresses"].update({"enP2p1s0f1np1": "192.168.200.14/24"}))
    assert "twins enp1s0f1np1 and enP2p1s0f1np1 share subnet 192.168.200.0/24" in message


def test_fabric_interface_that_is_the_management_interface() -> None:
    message = error_of(lambda d: d["cluster"].update({"management_interface": "enp1s0f1np1"}))
    assert "enp1s0f1np1 is the management interface" in message


def test_head_that_is_not_a_node() -> None:
    message = error_of(lambda d: d["cluster"].update({"head": "spark-z"}))
    assert "cluster.head: 'spark-z' is not a node (nodes: spark-a, spark-b)" in message


def test_two_heads() -> None:
    def two(d: dict[str, Any]) -> None:
        for node in d["nodes"]:
            node["head"] = True

    assert "only one node may be the head" in error_of(two)


def test_head_flag_makes_rank_zero() -> None:
    inventory = load(lambda d: d["nodes"][1].update({"head": True}))
    assert [n.name for n in inventory.ordered_nodes()] == ["spark-b", "spark-a"]


def test_network_address_is_not_a_host_address() -> None:
    message = error_of(lambda d: d["nodes"][0]["addresses"].update({"enp1s0f1np1": "192.168.200.0/24"}))
    assert "192.168.200.0/24 is not a host address in 192.168.200.0/24" in message


def test_peer_outside_the_subnet_of_its_link() -> None:
    message = error_of(lambda d: d["nodes"][1]["addresses"].update({"enp1s0f1np1": "192.168.210.13/24"}))
    assert "outside 192.168.200.0/24" in message


def test_address_without_prefix_and_garbage() -> None:
    assert "has no prefix length" in error_of(
        lambda d: d["nodes"][0]["addresses"].update({"enp1s0f1np1": "192.168.200.12"})
    )
    assert "is not an IPv4 address" in error_of(
        lambda d: d["nodes"][0]["addresses"].update({"enp1s0f1np1": "192.168.200.300/24"})
    )


def test_empty_node_list() -> None:
    message = error_of(lambda d: d.update({"nodes": []}))
    assert "nodes" in message and "at least 1" in message


def test_address_for_an_interface_not_in_the_fabric() -> None:
    message = error_of(lambda d: d["nodes"][0]["addresses"].update({"eth9": "10.9.9.9/24"}))
    assert "eth9: not a fabric interface" in message


def test_missing_address_for_a_fabric_interface() -> None:
    message = error_of(lambda d: d["nodes"][0]["addresses"].pop("enP2p1s0f1np1"))
    assert "no address for fabric interface enP2p1s0f1np1" in message


def test_addresses_are_derived_when_left_out() -> None:
    def strip(d: dict[str, Any]) -> None:
        for node in d["nodes"]:
            node.pop("addresses")

    inventory = load(strip)
    assert inventory.nodes[0].addresses == {
        "enp1s0f1np1": "192.168.200.12/24", "enP2p1s0f1np1": "192.168.201.12/24",
    }
    assert inventory.nodes[1].addresses["enP2p1s0f1np1"] == "192.168.201.13/24"  # type: ignore[index]


def test_shell_metacharacters_in_names_are_refused() -> None:
    message = error_of(lambda d: d.update({"engines": {"trtllm": {"container": {"name": "x; rm -rf /"}}}}))
    assert "engines: trtllm.container.name" in message


def test_mtu_range() -> None:
    assert "fabric.mtu" in error_of(lambda d: d["fabric"].update({"mtu": 100000}))


def test_yaml_duplicate_key_and_bad_yaml(tmp_path: Path) -> None:
    path = tmp_path / "inv.yml"
    path.write_text("cluster: {name: a}\ncluster: {name: b}\nnodes: []\n")
    with pytest.raises(InputError, match="duplicate key 'cluster'"):
        load_inventory(path)
    path.write_text("cluster: [unclosed\n")
    with pytest.raises(InputError, match=r"inv.yml: line \d+, column \d+"):
        load_inventory(path)
    path.write_text("- just\n- a list\n")
    with pytest.raises(InputError, match="expected a mapping"):
        load_inventory(path)


def test_yaml_bomb_is_refused(tmp_path: Path) -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 12):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        refs = ", ".join([f"*{prev}"] * 9)
        lines.append(f"{cur}: &{cur} [{refs}]")
    path = tmp_path / "bomb.yml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="YAML bomb"):
        load_inventory(path)


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"inventory file not found: .*nope\.yml"):
        load_inventory(tmp_path / "nope.yml")


def test_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    state.mkdir()
    remembered = tmp_path / "remembered.yml"
    remembered.write_text(yaml.safe_dump(BASE))
    (state / "last-inventory").write_text(str(remembered))
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    assert resolve_inventory_path("given.yml", state) == Path("given.yml")
    assert resolve_inventory_path(None, state) == remembered
    monkeypatch.setenv("SPARKCTL_INVENTORY", "env.yml")
    assert resolve_inventory_path(None, state) == Path("env.yml")
    monkeypatch.delenv("SPARKCTL_INVENTORY")
    remembered.unlink()
    assert resolve_inventory_path(None, state) == Path("two-sparks.yml")


def test_every_inventory_key_is_documented() -> None:
    from orchestrator.engines.trtllm.settings import TrtllmContainer
    from orchestrator.inventory import Cluster, Fabric, Node

    docs = (REPO / "docs" / "inventory.md").read_text()
    for model in (Cluster, Fabric, TrtllmContainer, Node):
        for key in model.model_fields:
            assert f"| `{key}` |" in docs, f"docs/inventory.md does not document {model.__name__}.{key}"


@pytest.mark.parametrize("name", ["two-sparks.yml", "three-sparks-ring.yml", "sparks-switch.yml"])
def test_every_shipped_inventory_is_valid(name: str) -> None:
    inventory = load_inventory(REPO / "inventories" / name)
    assert inventory.head_name == "spark-a"
    for node in inventory.nodes:
        assert set(node.addresses or {}) == set(inventory.fabric.interfaces)


def test_hostfile_addresses_are_reachable_from_the_head() -> None:
    ring = load_inventory(REPO / "inventories" / "three-sparks-ring.yml")
    # spark-b's first interface is on the b-c link; the head reaches it on the a-b link
    assert [ring.mpi_address(n) for n in ring.ordered_nodes()] == [
        "192.168.200.12", "192.168.200.13", "192.168.204.14"]
    switch = load_inventory(REPO / "inventories" / "sparks-switch.yml")
    assert [switch.mpi_address(n) for n in switch.ordered_nodes()] == [
        "192.168.200.12", "192.168.200.13", "192.168.200.14", "192.168.200.15"]
