"""Which QSFP port is cabled on every node, judged from `ibdev2netdev`, and the inventory that
follows (`sparkctl init`).

A Spark's ConnectX-7 shows each QSFP port as two "twin" interfaces (one per PCIe root):
port 1 is enp1s0f1np1 + enP2p1s0f1np1, port 0 is enp1s0f0np0 + enP2p1s0f0np0. A port is usable
on a node when both twins are Up; a cluster needs one port that is usable on every node (a cable
or a switch joins the same port everywhere). Pure functions: the CLI gathers the text, this
module judges it and writes the YAML.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.errors import InputError
from orchestrator.inventory import NAME_PATTERN

if TYPE_CHECKING:
    from orchestrator.netcheck.layout import Layout

PORTS: dict[str, tuple[str, str]] = {
    "port 1": ("enp1s0f1np1", "enP2p1s0f1np1"),
    "port 0": ("enp1s0f0np0", "enP2p1s0f0np0"),
}
"""The twins of each QSFP port; port 1 first: it is the inventory's default and NVIDIA's pages'."""


@dataclass(frozen=True)
class NodeLinks:
    """One node as `init` found it: the host it was reached at, its hostname, its link states."""

    host: str
    hostname: str
    states: dict[str, str]
    """interface -> "Up" / "Down" (ibdev2netdev's word)."""
    management: str = ""
    """The interface the controller's SSH connection arrived on ("" when unknown)."""

    def up_ports(self) -> list[str]:
        return [port for port, twins in PORTS.items()
                if all(self.states.get(name) == "Up" for name in twins)]

    def describe(self) -> str:
        shown = [f"{name} {self.states.get(name, 'missing')}"
                 for twins in PORTS.values() for name in twins]
        return f"{self.host} ({self.hostname}): " + ", ".join(shown)


@dataclass(frozen=True)
class PortChoice:
    port: str
    interfaces: tuple[str, str]
    reason: str


def parse_ibdev2netdev(text: str) -> dict[str, str]:
    """`rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)` lines -> {interface: state}."""
    states: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*\S+\s+port\s+\d+\s+==>\s+(\S+)\s+\((\w+)\)", line)
        if match:
            states[match.group(1)] = match.group(2)
    return states


def choose_port(nodes: list[NodeLinks]) -> PortChoice:
    """The port whose twins are Up on every node, and why; InputError naming each node's links
    when a node has no usable port or the nodes are cabled on different ports."""
    if not nodes:
        raise InputError("init: no hosts given")
    dead = [node for node in nodes if not node.up_ports()]
    if dead:
        raise InputError(
            "init: cabling is inconsistent: no QSFP port has both twins Up on "
            + "; ".join(node.describe() for node in dead)
            + ". Check the cable (both ends seated, `ibdev2netdev` should say (Up) on both twins "
            "of one port) and run init again")
    common = [port for port in PORTS if all(port in node.up_ports() for node in nodes)]
    if not common:
        by_port = "; ".join(f"{node.host}: {', '.join(node.up_ports())}" for node in nodes)
        raise InputError(
            f"init: cabling is inconsistent: the nodes are cabled on different ports ({by_port}); "
            "every node must use the same QSFP port (a back-to-back cable or a switch joins the "
            "same port on each Spark). Re-cable, or write the inventory by hand (docs/inventory.md)")
    port = common[0]
    others = [p for p in PORTS if p != port]
    if len(common) > 1:
        reason = (f"both ports are Up on all {len(nodes)} nodes; using {port}, the inventory's "
                  "default (a ring needs per-link subnets: see docs/inventory.md)")
    else:
        down = [node.host for node in nodes if others[0] not in node.up_ports()]
        reason = (f"{port} ({', '.join(PORTS[port])}) is Up on all {len(nodes)} nodes; "
                  f"{others[0]} is not Up on {', '.join(down)}")
    return PortChoice(port, PORTS[port], reason)


def node_names(nodes: list[NodeLinks]) -> list[str]:
    """Each node's name: its short hostname when that is a valid, unique node name, else
    spark-1, spark-2, ... for all (names must be unique and lower-case)."""
    names = [node.hostname.split(".")[0].lower() for node in nodes]
    if len(set(names)) == len(names) and all(re.match(NAME_PATTERN, n) for n in names):
        return names
    return [f"spark-{i + 1}" for i in range(len(nodes))]


@dataclass(frozen=True)
class InitSettings:
    name: str
    user: str | None
    ssh_key: str | None
    known_hosts: str | None


def inventory_text(settings: InitSettings, nodes: list[NodeLinks], layout: Layout) -> str:
    """The commented inventory `init` writes (every key documented in docs/inventory.md)."""
    from orchestrator.engines import REGISTRY

    names = node_names(nodes)
    interfaces = list(layout.interfaces)
    lines = [
        "# Written by `sparkctl init`. Every key is documented in docs/inventory.md.",
        f"# Fabric: {layout.reason}.",
        *(["# Addresses: as the adopted netplan files give them (sparkctl never rewrites them)."]
          if layout.adopted else
          ["# Addresses: one /24 per twin interface (NVIDIA's switch page: one subnet on two",
           "# interfaces breaks routing and NCCL), node i at .12+i as on NVIDIA's pages."]),
        "cluster:",
        f"  name: {settings.name}",
    ]
    # JSON strings are YAML strings: a path with ':' or '#' stays one value
    if settings.user:
        lines.append(f"  user: {json.dumps(settings.user)}")
    if settings.ssh_key:
        lines.append(f"  ssh_key: {json.dumps(settings.ssh_key)}")
    if settings.known_hosts:
        lines.append(f"  known_hosts: {json.dumps(settings.known_hosts)}")
    managements = {node.management for node in nodes}
    if len(managements) == 1 and "" not in managements:
        lines.append(f"  management_interface: {managements.pop()}   # where SSH arrived")
    said = f"the twins of {layout.port}" if layout.port else "both ports' twins"
    lines += [
        f"  head: {names[0]}                 # the node that serves (MPI rank 0)",
        "fabric:",
        f"  interfaces: [{', '.join(interfaces)}]   # {said}",
        f"  mtu: {layout.mtu}",
        f"  topology: {layout.topology}",
    ]
    if layout.adopted:
        lines.append(f"  network: adopted   # {', '.join(layout.adopted)} (verified, never written)")
    lines += [
        "engines:   # what the cluster serves: `up` sets each one up (drop those you do not use)",
        *(f"  {name}: {{}}" for name in sorted(REGISTRY)),
        "nodes:",
    ]
    for name, node, addresses in zip(names, nodes, layout.addresses, strict=True):
        lines += [
            f"  - name: {name}",
            f"    host: {json.dumps(node.host)}",
            "    addresses: {" + ", ".join(f"{k}: {v}" for k, v in addresses.items()) + "}",
        ]
    return "\n".join(lines) + "\n"
