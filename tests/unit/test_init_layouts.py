"""`sparkctl init` beyond one cable (issue 36): the layouts NVIDIA documents recognised from the
link-local peer probe (two back to back, a ring of three, a switch), a refusal naming what each
port reaches for anything else, and a network NVIDIA Sync (or a hand) already configured,
adopted from the netplan files the real gatherer reads, or refused naming the inconsistency."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from conftest import FakeCluster, make_inventory, node_facts
from nodescript import run_node_script

from orchestrator.cli import cli
from orchestrator.cli.init import Probed
from orchestrator.errors import InputError
from orchestrator.inventory_checks import inventory_from_data
from orchestrator.netcheck.adoption import adopt
from orchestrator.netcheck.cabling import InitSettings, NodeLinks, inventory_text
from orchestrator.netcheck.layout import Reach, choose_layout, reach_from
from orchestrator.remote.gathered import NodeFacts

GOLDEN = Path(__file__).parent / "golden" / "netplan-adopt"
P1 = ("enp1s0f1np1", "enP2p1s0f1np1")
P0 = ("enp1s0f0np0", "enP2p1s0f0np0")



def parsed_all(answers: list[dict[str, Any]]) -> list[NodeFacts]:
    """Each node's answer parsed as gather_facts parses it."""
    return [node_facts(answer) for answer in answers]

def links(host: str, *ports: tuple[str, str]) -> NodeLinks:
    up = {name for port in ports for name in port}
    return NodeLinks(host, host, {name: "Up" if name in up else "Down" for name in P1 + P0},
                     "eth0")


def mac(node: int, iface: str) -> str:
    return f"02:00:00:00:{node:02x}:{(P1 + P0).index(iface):02x}"


def answers(wiring: dict[tuple[int, str], list[int]], count: int) -> list[dict[str, Any]]:
    """node/peers.py's answers for WIRING: (node, interface) -> the nodes that answer there; a
    MAC no node owns (a switch's own port) answers too and must be ignored."""
    out = []
    for node in range(count):
        interfaces = {}
        for iface in P1 + P0:
            heard = [mac(peer, _facing(wiring, peer, node, iface)) for peer in wiring.get((node, iface), [])]
            interfaces[iface] = {"present": True, "up": True, "carrier": True,
                                 "peers": [*heard, "0a:ff:ff:ff:ff:01"] if heard else []}
        out.append({"macs": [mac(node, i) for i in P1 + P0], "interfaces": interfaces})
    return out


def _facing(wiring: dict[tuple[int, str], list[int]], peer: int, node: int, iface: str) -> str:
    """The peer's interface that answered: the one whose wiring lists NODE (same twin)."""
    twin = (P1 + P0).index(iface) % 2
    return next((i for i in (P1 + P0) if (P1 + P0).index(i) % 2 == twin
                 and node in wiring.get((peer, i), [])), iface)


def ring3() -> dict[tuple[int, str], list[int]]:
    """node i's port 1 to node i+1's port 0, as the lab cables a ring."""
    wiring: dict[tuple[int, str], list[int]] = {}
    for node in range(3):
        right = (node + 1) % 3
        for twin in range(2):
            wiring[(node, P1[twin])] = [right]
            wiring[(right, P0[twin])] = [node]
    return wiring


def test_a_ring_of_three_gets_a_pair_of_subnets_per_link_and_loads() -> None:
    nodes = [links(h, P1, P0) for h in ("a", "b", "c")]
    layout = choose_layout(nodes, reach_from(answers(ring3(), 3), ["a", "b", "c"]))
    assert layout.topology == "ring" and layout.interfaces == P1 + P0
    assert "a ring of 3 (a - b - c)" in layout.reason
    # a's port 1 and b's port 0 share the first link's two /24s; every link its own pair
    assert layout.addresses[0]["enp1s0f1np1"] == "192.168.200.12/24"
    assert layout.addresses[1]["enp1s0f0np0"] == "192.168.200.13/24"
    assert layout.addresses[1]["enP2p1s0f0np0"] == "192.168.201.13/24"
    subnets = [a.rsplit(".", 1)[0] for found in layout.addresses for a in found.values()]
    assert sorted(set(subnets)) == [f"192.168.{n}" for n in range(200, 206)]
    text = inventory_text(InitSettings("ring", None, None, None), nodes, layout)
    inventory = inventory_from_data(yaml.safe_load(text), "ring.yml")
    assert inventory.topology == "ring"
    assert inventory.mpi_address(inventory.node("c")).startswith("192.168.20")


def test_a_switch_of_four_is_port_1_reaching_everyone() -> None:
    wiring = {(n, iface): [p for p in range(4) if p != n] for n in range(4) for iface in P1}
    nodes = [links(h, P1) for h in "abcd"]
    layout = choose_layout(nodes, reach_from(answers(wiring, 4), list("abcd")))
    assert (layout.topology, layout.interfaces) == ("switch", P1)
    assert layout.addresses[3] == {"enp1s0f1np1": "192.168.200.15/24",
                                   "enP2p1s0f1np1": "192.168.201.15/24"}
    assert "behind a switch" in layout.reason


def test_cabling_that_matches_no_layout_is_refused_naming_each_port() -> None:
    # four nodes, both ports up, but a chain (a-b-c-d), not a ring and not a switch
    wiring: dict[tuple[int, str], list[int]] = {}
    for node in range(3):
        for twin in range(2):
            wiring[(node, P1[twin])] = [node + 1]
            wiring[(node + 1, P0[twin])] = [node]
    nodes = [links(h, P1, P0) for h in "abcd"]
    with pytest.raises(InputError, match="matches none of the layouts NVIDIA documents") as err:
        choose_layout(nodes, reach_from(answers(wiring, 4), list("abcd")))
    assert "a: port 1 reaches b; port 0 reaches nothing" in str(err.value)


def test_twins_that_disagree_are_named() -> None:
    wiring = ring3()
    wiring[(0, "enP2p1s0f1np1")] = [2]  # a's second twin cabled elsewhere
    nodes = [links(h, P1, P0) for h in "abc"]
    with pytest.raises(InputError, match="port 1: enp1s0f1np1 reaches b but enP2p1s0f1np1 reaches c"):
        choose_layout(nodes, reach_from(answers(wiring, 3), list("abc")))


def test_three_nodes_with_both_ports_up_and_no_probe_answer_are_refused() -> None:
    nodes = [links(h, P1, P0) for h in "abc"]
    with pytest.raises(InputError, match="cannot tell a ring from a switch"):
        choose_layout(nodes, Reach([{}, {}, {}], probed=False, names=list("abc")))


def test_two_nodes_cabled_port_1_to_port_0_are_refused() -> None:
    """Both ports Up on both (the other port to something else): port 1, the common one, of b
    does not reach a."""
    wiring = {(0, iface): [1] for iface in P1} | {(1, iface): [0] for iface in P0}
    with pytest.raises(InputError, match="port 1 of b does not reach a"):
        choose_layout([links("a", P1, P0), links("b", P1, P0)],
                      reach_from(answers(wiring, 2), ["a", "b"]))


def test_the_peer_probe_script_reads_neighbours_by_mac(monkeypatch: pytest.MonkeyPatch) -> None:
    """node/peers.py as it runs: `ip -j link`, a ping per live interface, `ip -j -6 neigh`."""
    import subprocess

    link = [{"ifname": "enp1s0f1np1", "address": "02:00:00:00:00:00", "flags": ["UP", "LOWER_UP"]},
            {"ifname": "enp1s0f0np0", "address": "02:00:00:00:00:02", "flags": ["NO-CARRIER", "UP"]}]
    neigh = [{"dst": "fe80::1", "lladdr": "02:00:00:00:01:02", "state": ["REACHABLE"]},
             {"dst": "fe80::2", "lladdr": "0a:00:00:00:00:09", "state": ["FAILED"]}]
    seen: list[list[str]] = []

    def fake_run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        verb = argv[3] if argv[2] == "-6" else argv[2]  # ip -j [-6] VERB ...
        out = {"link": json.dumps(link), "neigh": json.dumps(neigh), "addr": "[]"}[verb]
        return subprocess.CompletedProcess(argv, 0, out, "")

    class FakePing:
        def __init__(self, argv: list[str], **kwargs: Any) -> None:
            seen.append(argv)

        def wait(self, timeout: float) -> int:
            return 0

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(subprocess, "Popen", FakePing)
    ran = run_node_script("peers.py", [json.dumps({"interfaces": ["enp1s0f1np1", "enp1s0f0np0",
                                                                  "enP2p1s0f0np0"]})], monkeypatch)
    answer = ran.json
    assert answer["interfaces"]["enp1s0f1np1"]["peers"] == ["02:00:00:00:01:02"]
    assert answer["interfaces"]["enp1s0f0np0"]["peers"] == []  # no carrier: not pinged
    assert answer["interfaces"]["enP2p1s0f0np0"] == {"present": False}
    pings = [argv for argv in seen if argv[0] == "ping"]
    assert pings == [["ping", "-6", "-n", "-q", "-c", "2", "-i", "1", "-w", "3", "ff02::1%enp1s0f1np1"]]


# ------------------------------------------------------------------------------ adoption

def gathered(tree: str, monkeypatch: pytest.MonkeyPatch, live: dict[str, tuple[str, int]]) -> dict[str, Any]:
    """The gatherer's netplan fact for a golden tree (as /etc/netplan) and the live links."""
    directory = GOLDEN / tree
    ran = run_node_script("gather.py", [json.dumps({"netplan": True})], monkeypatch,
                          replace={'directory="/etc/netplan"': f'directory="{directory}"'})
    netplan = {path.replace(str(directory), "/etc/netplan"): fact
               for path, fact in ran.json["netplan"].items()}
    return {"netplan": netplan, "links": {
        name: {"up": True, "carrier": True, "mtu": mtu, "addresses": [address] if address else []}
        for name, (address, mtu) in live.items()}}


def sync_facts(monkeypatch: pytest.MonkeyPatch, b_live: dict[str, tuple[str, int]] | None = None
               ) -> list[dict[str, Any]]:
    a = gathered("sync-a", monkeypatch, {"enp1s0f1np1": ("10.100.32.1/24", 9000),
                                         "enP2p1s0f1np1": ("10.100.33.1/24", 9000)})
    b = gathered("sync-b", monkeypatch, b_live or {"enp1s0f1np1": ("10.100.32.2/24", 9000),
                                                   "enP2p1s0f1np1": ("10.100.33.2/24", 9000)})
    return [a, b]


B2B = reach_from(answers({(n, i): [1 - n] for n in range(2) for i in P1}, 2), ["a", "b"])


def test_a_sync_network_is_adopted_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = adopt(["a", "b"], parsed_all(sync_facts(monkeypatch)), B2B)
    assert layout is not None
    assert (layout.topology, layout.interfaces, layout.mtu) == ("b2b", P1, 9000)
    assert layout.adopted == ("/etc/netplan/99-nvidia-sync-cluster.yaml",)
    assert layout.addresses[1] == {"enp1s0f1np1": "10.100.32.2/24", "enP2p1s0f1np1": "10.100.33.2/24"}
    text = inventory_text(InitSettings("sync", None, None, None), [links("a", P1), links("b", P1)],
                          layout)
    inventory = inventory_from_data(yaml.safe_load(text), "sync.yml")
    assert inventory.fabric.network == "adopted" and inventory.fabric.interfaces == list(P1)


def test_nothing_to_adopt_without_fabric_addresses_in_other_files() -> None:
    assert adopt(["a", "b"], parsed_all([{"netplan": {}}, {"netplan": {}}]), B2B) is None


@pytest.mark.parametrize(("b_live", "said"), [
    ({"enp1s0f1np1": ("", 9000), "enP2p1s0f1np1": ("10.100.33.2/24", 9000)},
     "b: /etc/netplan/99-nvidia-sync-cluster.yaml gives enp1s0f1np1 10.100.32.2/24 but the "
     "interface has no address (not applied: `sudo netplan apply`)"),
    ({"enp1s0f1np1": ("10.100.32.2/24", 1500), "enP2p1s0f1np1": ("10.100.33.2/24", 9000)},
     "gives enp1s0f1np1 MTU 9000 but it runs 1500"),
])
def test_a_network_not_applied_is_refused(monkeypatch: pytest.MonkeyPatch, b_live: Any, said: str) -> None:
    with pytest.raises(InputError, match="cannot adopt it") as err:
        adopt(["a", "b"], parsed_all(sync_facts(monkeypatch, b_live)), B2B)
    assert said in str(err.value)


def test_inconsistent_networks_are_refused_naming_what(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = sync_facts(monkeypatch)
    only_a = [a, {"netplan": {}, "links": b["links"]}]
    with pytest.raises(InputError, match=r"address different fabric interfaces \(a: enp1s0f1np1 in "):
        adopt(["a", "b"], parsed_all(only_a), B2B)
    # twins in one subnet
    b["netplan"]["/etc/netplan/99-nvidia-sync-cluster.yaml"]["definitions"]["enP2p1s0f1np1"][
        "addresses"] = ["10.100.32.3/24"]
    b["links"]["enP2p1s0f1np1"]["addresses"] = ["10.100.32.3/24"]
    with pytest.raises(InputError, match=re.escape("b: enp1s0f1np1, enP2p1s0f1np1 share 10.100.32.0/24")):
        adopt(["a", "b"], parsed_all([a, b]), B2B)


def test_dhcp_is_not_a_fixed_address(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = sync_facts(monkeypatch)
    b["netplan"]["/etc/netplan/99-nvidia-sync-cluster.yaml"]["definitions"]["enp1s0f1np1"]["dhcp4"] = True
    with pytest.raises(InputError, match="turns on dhcp4 for enp1s0f1np1"):
        adopt(["a", "b"], parsed_all([a, b]), B2B)


def test_subnets_that_the_cables_do_not_join_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    crossed = reach_from(answers({(n, i): [] for n in range(2) for i in P1}
                                 | {(0, "enp1s0f1np1"): [1], (1, "enp1s0f1np1"): [0]}, 2), ["a", "b"])
    with pytest.raises(InputError, match=re.escape("enP2p1s0f1np1 shares 10.100.33.0/24 with b, "
                                                   "but its cable does not reach b")):
        adopt(["a", "b"], parsed_all(sync_facts(monkeypatch)), crossed)


def test_the_command_writes_the_adopted_inventory(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    facts = sync_facts(monkeypatch)
    probe = answers({(n, i): [1 - n] for n in range(2) for i in P1}, 2)
    monkeypatch.setattr("orchestrator.cli.init._probe", lambda *args: Probed(
        [links("10.0.0.1", P1), links("10.0.0.2", P1)], probe, parsed_all(facts)))
    out = tmp_path / "inv.yml"
    result = CliRunner().invoke(cli, ["init", "10.0.0.1", "10.0.0.2", "-o", str(out), "--yes"])
    assert result.exit_code == 0, result.output
    assert "adopting the network of /etc/netplan/99-nvidia-sync-cluster.yaml" in result.output
    data = yaml.safe_load(out.read_text())
    assert data["fabric"]["network"] == "adopted"
    assert "network: adopted   # /etc/netplan/99-nvidia-sync-cluster.yaml" in out.read_text()


def test_probe_reads_every_node_and_judges_the_cabling_without_sudo(
        fake_cluster: Callable[..., FakeCluster], monkeypatch: pytest.MonkeyPatch) -> None:
    """init's glue over the nodes: ibdev2netdev, hostname, the management interface, the peer
    probe (node/peers.py on stdin) and the gatherer; a node whose sudo wants a password cannot
    show its 0600 netplan files: a warning, and the cabling is judged alone."""
    from orchestrator.cli import init as init_cli

    data = {"cluster": {"name": "init"}, "nodes": [{"name": "host-1", "host": "10.0.0.1"},
                                                   {"name": "host-2", "host": "10.0.0.2"}]}
    sync = sync_facts(monkeypatch)
    cluster = fake_cluster(make_inventory(data), facts={
        "host-1": sync[0], "host-2": (1, "", "sudo: a password is required")})
    probe = answers({(n, i): [1 - n] for n in range(2) for i in P1}, 2)
    for index, name in enumerate(("host-1", "host-2")):
        node = cluster[name]
        node.on("^ibdev2netdev$", stdout="rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\n"
                                         "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)\n")
        node.on("^hostname$", stdout=f"spark-{'ab'[index]}\n")
        node.on("SSH_CONNECTION", stdout="eth0\n")
        node.on('"interfaces": ', stdout=json.dumps(probe[index]))
    monkeypatch.setattr("orchestrator.remote.connect.connect_all",
                        lambda *args: (dict(cluster.transports), {}))
    found = init_cli._probe(("10.0.0.1", "10.0.0.2"), None, None, None, False)
    assert [n.hostname for n in found.nodes] == ["spark-a", "spark-b"]
    assert found.nodes[0].up_ports() == ["port 1"] and found.nodes[1].management == "eth0"
    assert found.facts[1] is None and found.facts[0] is not None and found.facts[0].netplan
    probe_call = next(c for c in cluster["host-1"].calls if '"interfaces": ' in c.command)
    assert "ff02::1" in str(probe_call.stdin)  # node/peers.py itself, on stdin
    layout = found.layout()  # without spark-b's files nothing is adopted: the cable decides
    assert (layout.topology, layout.adopted, layout.port) == ("b2b", (), "port 1")
