"""The cabling layouts NVIDIA documents, recognised from what `init` probed (pure).

NVIDIA's pages cable Sparks three ways: two back to back (one cable between the same port of
each), three in a ring (each Spark's two QSFP ports to its two neighbours), and up to eight
behind a switch (one port of every Spark on the switch). node/peers.py says, for each fabric
interface of each node, which machines answered on it (by MAC address); this module turns that
into which node reaches which over which port, picks the layout it matches and the addresses
`up` will give it, or refuses naming what each node's ports reach.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import InputError
from orchestrator.inventory import DEFAULT_SUBNET_BASE, FIRST_HOST_NUMBER, derive_addresses
from orchestrator.netcheck.cabling import PORTS, NodeLinks, choose_port

RING_INTERFACES = PORTS["port 1"] + PORTS["port 0"]
"""A ring uses both ports: port 1's twins first (the inventory's default port), then port 0's."""


@dataclass(frozen=True)
class Layout:
    """What `init` writes: the topology, the fabric interfaces and each node's addresses."""

    topology: str
    interfaces: tuple[str, ...]
    addresses: list[dict[str, str]]
    """Per node, in the order given: interface -> CIDR."""
    reason: str
    port: str = ""
    """The port of a back-to-back or switch layout ("" in a ring: both)."""
    mtu: int = 9000
    adopted: tuple[str, ...] = ()
    """The netplan files of an adopted network (netcheck/adoption.py); () when sparkctl writes it."""


@dataclass(frozen=True)
class Reach:
    """Which nodes (by index) answered on each fabric interface of each node."""

    peers: list[dict[str, frozenset[int]]]
    probed: bool = True
    """False when no node answered the link-local probe at all (IPv6 off everywhere)."""
    names: list[str] = field(default_factory=list)

    def port_peers(self, node: int, port: str) -> frozenset[int] | None:
        """The nodes both twins of PORT reach, or None when the twins disagree."""
        first, second = (self.peers[node].get(name, frozenset()) for name in PORTS[port])
        return first if first == second else None

    def describe(self, node: int) -> str:
        parts = []
        for port, twins in PORTS.items():
            seen = [", ".join(self.names[i] for i in sorted(self.peers[node].get(t, frozenset())))
                    or "nothing" for t in twins]
            parts.append(f"{port} reaches {seen[0]}" if seen[0] == seen[1] else
                         f"{port}: {twins[0]} reaches {seen[0]} but {twins[1]} reaches {seen[1]}")
        return f"{self.names[node]}: " + "; ".join(parts)


def reach_from(answers: list[dict[str, Any]], names: list[str]) -> Reach:
    """node/peers.py's answers (one per node, same order as `names`) -> Reach."""
    owner: dict[str, int] = {}
    for index, answer in enumerate(answers):
        for mac in answer.get("macs") or []:
            owner[str(mac)] = index
    peers: list[dict[str, frozenset[int]]] = []
    heard = False
    for index, answer in enumerate(answers):
        interfaces = answer.get("interfaces") or {}
        found: dict[str, frozenset[int]] = {}
        for name, entry in interfaces.items():
            macs = entry.get("peers") or [] if isinstance(entry, dict) else []
            heard = heard or bool(macs)
            found[name] = frozenset(owner[m] for m in macs if m in owner and owner[m] != index)
        peers.append(found)
    return Reach(peers, heard, names)


def choose_layout(nodes: list[NodeLinks], reach: Reach) -> Layout:
    """The documented layout these nodes are cabled in, or InputError naming each node's ports."""
    count = len(nodes)
    # without answers from the probe, only one port Up everywhere rules a ring out
    both_up = all(len(node.up_ports()) == len(PORTS) for node in nodes)
    if count == 2 or not reach.probed:
        choice = choose_port(nodes)  # two nodes: the port Up on both (back to back or a switch)
        if count == 2 and reach.probed:
            _check_pair(reach, choice.port)
        if count > 2 and both_up:
            raise InputError(
                "init: no node answered on its fabric interfaces' IPv6 link-local addresses, so "
                f"init cannot tell a ring from a switch for {count} nodes. Check that IPv6 is on "
                "for the fabric interfaces (`ip -6 addr show dev enp1s0f1np1` lists an fe80:: "
                "address) or write the inventory by hand (docs/inventory.md)")
        topology = "b2b" if count == 2 else "switch"
        return Layout(topology, choice.interfaces,
                      [derive_addresses(i, list(choice.interfaces)) for i in range(count)],
                      choice.reason, choice.port)
    everyone = [frozenset(set(range(count)) - {i}) for i in range(count)]
    for port in PORTS:
        if all(reach.port_peers(i, port) == everyone[i] for i in range(count)):
            interfaces = PORTS[port]
            return Layout("switch", interfaces,
                          [derive_addresses(i, list(interfaces)) for i in range(count)],
                          f"{port} ({', '.join(interfaces)}) of all {count} nodes reaches every "
                          "other node: behind a switch", port)
    ring = _ring(reach, count)
    if ring is not None:
        return ring
    raise InputError(
        f"init: the cabling of these {count} nodes matches none of the layouts NVIDIA documents "
        "(two back to back, three in a ring: each Spark's two ports to its two neighbours, up to "
        "eight behind a switch: the same port of every Spark). What each port reaches: "
        + "; ".join(reach.describe(i) for i in range(count))
        + ". Re-cable, or write the inventory by hand (docs/inventory.md)")


def _check_pair(reach: Reach, port: str) -> None:
    """Two nodes: the chosen port of each must reach the other (not a third machine's switch)."""
    for node, other in ((0, 1), (1, 0)):
        seen = reach.port_peers(node, port)
        if seen is not None and other not in seen and any(reach.peers[node].values()):
            raise InputError(
                f"init: {port} of {reach.names[node]} does not reach {reach.names[other]} "
                f"({reach.describe(node)}); check which ports the cable joins")


def _ring(reach: Reach, count: int) -> Layout | None:
    """Each node's two ports reach one neighbour each, the two different, all in one cycle."""
    neighbours: dict[tuple[int, str], int] = {}
    for node in range(count):
        for port in PORTS:
            seen = reach.port_peers(node, port)
            if seen is None or len(seen) != 1:
                return None
            neighbours[(node, port)] = next(iter(seen))
        if neighbours[(node, "port 0")] == neighbours[(node, "port 1")]:
            return None
    links: list[tuple[tuple[int, str], tuple[int, str]]] = []
    numbered: set[tuple[int, str]] = set()
    for node in range(count):
        for port in PORTS:
            if (node, port) in numbered:
                continue
            other = neighbours[(node, port)]
            back = [p for p in PORTS if neighbours[(other, p)] == node and (other, p) not in numbered]
            if not back:
                return None
            numbered |= {(node, port), (other, back[0])}
            links.append(((node, port), (other, back[0])))
    if not _one_cycle(neighbours, count):
        return None
    base = ipaddress.IPv4Address(DEFAULT_SUBNET_BASE)
    addresses: list[dict[str, str]] = [{} for _ in range(count)]
    for number, ends in enumerate(links):
        for twin in range(2):
            subnet = base + 256 * (2 * number + twin)
            for node, port in ends:
                addresses[node][PORTS[port][twin]] = f"{subnet + FIRST_HOST_NUMBER + node}/24"
    ordered = [{name: found[name] for name in RING_INTERFACES} for found in addresses]
    order = " - ".join(reach.names[i] for i in _cycle_order(neighbours, count))
    return Layout("ring", RING_INTERFACES, ordered,
                  f"each node's two ports reach its two neighbours: a ring of {count} "
                  f"({order}); each link is its own pair of /24s")


def _cycle_order(neighbours: dict[tuple[int, str], int], count: int) -> list[int]:
    order, here = [0], neighbours[(0, "port 1")]
    while here != 0 and len(order) <= count:
        order.append(here)
        here = next(n for n in (neighbours[(here, p)] for p in PORTS) if n != order[-2])
    return order


def _one_cycle(neighbours: dict[tuple[int, str], int], count: int) -> bool:
    order = _cycle_order(neighbours, count)
    return len(order) == count and len(set(order)) == count
