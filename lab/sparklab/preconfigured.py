"""`lab up --preconfigured sync|manual`: nodes whose fabric someone else already configured.

`sync` lays down what NVIDIA Sync's Cluster Assistant leaves on a Spark:
/etc/netplan/99-nvidia-sync-cluster.yaml (mode 0600) giving both twins of the cabled port a
fixed address (`dhcp4: false`, MTU 9000, one /24 per twin: 10.100.32.N/24, 10.100.33.N/24, node
N counted from 1; a ring: one pair of /24s per link), then applies it with the node's real
`netplan apply`. `manual` does the same as a hand-written /etc/netplan/40-cx7.yaml with the
lab's usual addresses (192.168.200.12/24, ...). The lab's inventory then adopts that network
(`fabric.network: adopted`), as `sparkctl init` would. Pure text here, plus one apply per node.
"""

from __future__ import annotations

from sparklab.identity import LabError, LabIdentity
from sparklab.node import node_exec
from sparklab.topology import LabPlan

KINDS = ("sync", "manual")
FILES = {"sync": "/etc/netplan/99-nvidia-sync-cluster.yaml", "manual": "/etc/netplan/40-cx7.yaml"}
HEADERS = {
    "sync": "# NVIDIA Sync Cluster Assistant: ConnectX-7 cluster network (simulated by sparklab)",
    "manual": "# ConnectX-7 fabric, written by hand (simulated by sparklab)",
}


def sync_address(lab_address: str) -> str:
    """The lab's 192.168.(200+n).(12+i)/24 as Sync numbers it: 10.100.(32+n).(i+1)/24."""
    host, prefix = lab_address.split("/")
    octets = [int(part) for part in host.split(".")]
    return f"10.100.{32 + octets[2] - 200}.{octets[3] - 11}/{prefix}"


def addresses(kind: str, plan: LabPlan) -> list[dict[str, str]]:
    """Each node's fabric addresses under the preconfigured network (the plan's order)."""
    if kind == "sync":
        return [{iface: sync_address(cidr) for iface, cidr in node.addresses.items()}
                for node in plan.nodes]
    return [dict(node.addresses) for node in plan.nodes]


def netplan_text(kind: str, node_addresses: dict[str, str], mtu: int = 9000) -> str:
    lines = [HEADERS[kind], "network:", "  version: 2", "  ethernets:"]
    for iface, cidr in node_addresses.items():
        lines += [f"    {iface}:", "      dhcp4: false", f"      mtu: {mtu}",
                  f"      addresses: [{cidr}]"]
    return "\n".join(lines) + "\n"


def lay_down(ident: LabIdentity, kind: str, plan: LabPlan) -> None:
    """Write the file on every node (0600 root, as netplan wants) and `netplan apply` it."""
    if kind not in KINDS:
        raise LabError(f"--preconfigured: {kind!r} is not one of {', '.join(KINDS)}", 2)
    path = FILES[kind]
    for node, wanted in zip(plan.nodes, addresses(kind, plan), strict=True):
        node_exec(ident, node.name, ["install", "-m", "600", "-o", "root", "-g", "root",
                                     "/dev/stdin", path], input_text=netplan_text(kind, wanted))
        node_exec(ident, node.name, ["netplan", "apply"], timeout=120)
