"""The lab's wiring as data: which node ports are cabled to what, and fabric addresses.

Pure functions only (no I/O), so the wiring rules are unit-testable without root.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparklab.identity import (
    ALL_FABRIC_INTERFACES,
    DEFAULT_PORTS,
    PORT_TWINS,
    LabError,
    node_name,
)

TOPOLOGIES = ("b2b", "ring", "switch")


@dataclass(frozen=True)
class Cable:
    """One QSFP twin link: a veth pair with the Spark name on both ends (b2b, ring)."""

    a: str
    a_if: str
    b: str
    b_if: str


@dataclass(frozen=True)
class SwitchPort:
    """A node interface plugged into the fabric bridge of one twin (switch topology)."""

    node: str
    interface: str
    bridge_index: int


@dataclass
class NodePlan:
    name: str
    index: int
    cabled: list[str] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)

    @property
    def uncabled(self) -> list[str]:
        return [i for i in ALL_FABRIC_INTERFACES if i not in self.cabled]


@dataclass
class LabPlan:
    topology: str
    nodes: list[NodePlan]
    cables: list[Cable] = field(default_factory=list)
    switch_ports: list[SwitchPort] = field(default_factory=list)
    fabric_interfaces: list[str] = field(default_factory=list)


def parse_ports(value: str | None) -> tuple[str, str]:
    if not value:
        return DEFAULT_PORTS
    names = tuple(p.strip() for p in value.split(",") if p.strip())
    if len(names) != 2 or len(set(names)) != 2:
        raise LabError(f"--ports takes two twin interfaces, e.g. {','.join(DEFAULT_PORTS)}", 2)
    for name in names:
        if name not in ALL_FABRIC_INTERFACES:
            raise LabError(f"--ports: unknown interface {name!r}; Spark fabric interfaces are "
                           f"{', '.join(ALL_FABRIC_INTERFACES)}", 2)
    return names[0], names[1]


def build_plan(topology: str, nodes: int | None, ports: tuple[str, str]) -> LabPlan:
    if topology not in TOPOLOGIES:
        raise LabError(f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}", 2)
    count = nodes if nodes is not None else {"b2b": 2, "ring": 3, "switch": 2}[topology]
    if topology == "b2b" and count != 2:
        raise LabError("a b2b (back-to-back) lab has exactly 2 nodes; use --topology switch "
                       "or ring for more", 2)
    if topology == "ring" and not 2 <= count <= 27:
        raise LabError("a ring lab has 2 to 27 nodes", 2)
    if topology == "switch" and not 1 <= count <= 64:
        raise LabError("a switch lab has 1 to 64 nodes", 2)
    node_plans = [NodePlan(node_name(i), i) for i in range(count)]
    if topology == "ring":
        return _ring(node_plans)
    plan = LabPlan(topology, node_plans, fabric_interfaces=list(ports))
    for node in node_plans:
        node.cabled = list(ports)
        for twin, iface in enumerate(ports):
            node.addresses[iface] = f"192.168.{200 + twin}.{12 + node.index}/24"
    if topology == "b2b":
        a, b = node_plans
        plan.cables = [Cable(a.name, iface, b.name, iface) for iface in ports]
    else:
        plan.switch_ports = [SwitchPort(n.name, iface, twin)
                             for n in node_plans for twin, iface in enumerate(ports)]
    return plan


def _ring(node_plans: list[NodePlan]) -> LabPlan:
    """Node i's port 1 twins cable to node i+1's port 0 twins; each link gets its own /24s."""
    out_port, in_port = PORT_TWINS[1], PORT_TWINS[0]
    plan = LabPlan("ring", node_plans, fabric_interfaces=list(out_port + in_port))
    count = len(node_plans)
    for link in range(count):
        left, right = node_plans[link], node_plans[(link + 1) % count]
        for twin in range(2):
            subnet = f"192.168.{200 + 2 * link + twin}"
            plan.cables.append(Cable(left.name, out_port[twin], right.name, in_port[twin]))
            left.addresses[out_port[twin]] = f"{subnet}.{12 + left.index}/24"
            right.addresses[in_port[twin]] = f"{subnet}.{12 + right.index}/24"
    for node in node_plans:
        node.cabled = [i for i in ALL_FABRIC_INTERFACES if i in node.addresses]
    return plan
