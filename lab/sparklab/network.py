"""Host-side wiring of a lab: namespaces, the management bridge, fabric cables and empty cages.

Every device the lab makes on the host is named with the lab prefix (`sparklab<ID>...`).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence

from sparklab.identity import MGMT_INTERFACE, LabError, LabIdentity
from sparklab.topology import LabPlan

FABRIC_SWITCH_MTU = 9216  # the "switch" carries jumbo frames, like a real RoCE fabric switch


def run(argv: Sequence[str], check: bool = True, input_text: str | None = None) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, input=input_text,
                            check=False)
    if check and result.returncode != 0:
        raise LabError(f"lab command failed: {' '.join(argv)}\n{result.stderr.strip()}", 1)
    return result.stdout


def ip_batch(commands: list[str], netns: str | None = None) -> None:
    """Many `ip` commands in one process (fast for 16+ node labs)."""
    if not commands:
        return
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    run([*prefix, "-batch", "-"], input_text="\n".join(commands) + "\n")


def netns_list() -> list[str]:
    return [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()]


def host_links() -> list[str]:
    out = run(["ip", "-o", "link", "show"])
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


LAB_RANGE = "10.213.0.0/16"
"""Every lab's addresses (10.213.<ID>.0/24, identity.py)."""


def create_management(ident: LabIdentity) -> None:
    # Traffic for a lab that is down never leaves the machine: without this route, a
    # connection that outlives its lab (sparkctl's kept SSH connections, remote/keeper.py, a
    # client still retrying) would follow the default route out of the host. The /24 of a lab
    # that is up is more specific and wins; the route stays (it only ever refuses the range).
    ip_batch([
        f"route replace unreachable {LAB_RANGE}",
        f"link add {ident.bridge} type bridge",
        f"addr add {ident.host_address}/24 dev {ident.bridge}",
        f"link set {ident.bridge} up",
    ])


def create_node_netns(ident: LabIdentity, node: str, index: int) -> None:
    ns = ident.netns(node)
    run(["ip", "netns", "add", ns])
    veth = ident.host_veth(index)
    ip_batch([
        f"link add {veth} type veth peer name {MGMT_INTERFACE} netns {ns}",
        f"link set {veth} master {ident.bridge} up",
    ])
    ip_batch([
        "link set lo up",
        f"addr add {ident.mgmt_address(index)}/24 dev {MGMT_INTERFACE}",
        f"link set {MGMT_INTERFACE} up",
    ], netns=ns)


def create_jump(ident: LabIdentity) -> None:
    """The jump node: eth0 on the management bridge, and the Sparks' bridge `inner` (no IP
    forwarding: a fresh namespace has it off, and nothing turns it on)."""
    ns = ident.netns(ident.JUMP_NODE)
    run(["ip", "netns", "add", ns])
    veth = ident.host_veth(ident.JUMP_HOST_INDEX)
    ip_batch([
        f"link add {veth} type veth peer name {MGMT_INTERFACE} netns {ns}",
        f"link set {veth} master {ident.bridge} up",
    ])
    ip_batch([
        "link set lo up",
        f"addr add {ident.jump_address}/24 dev {MGMT_INTERFACE}",
        f"link set {MGMT_INTERFACE} up",
        "link add inner type bridge",
        f"addr add {ident.jump_inner_address}/25 dev inner",
        "link set inner up",
    ], netns=ns)


def create_node_behind_jump(ident: LabIdentity, node: str, index: int) -> None:
    ns = ident.netns(node)
    jump = ident.netns(ident.JUMP_NODE)
    run(["ip", "netns", "add", ns])
    ip_batch([
        f"link add s{index} type veth peer name {MGMT_INTERFACE} netns {ns}",
        f"link set s{index} master inner up",
    ], netns=jump)
    ip_batch([
        "link set lo up",
        f"addr add {ident.inner_address(index)}/25 dev {MGMT_INTERFACE}",
        f"link set {MGMT_INTERFACE} up",
    ], netns=ns)


def create_fabric(ident: LabIdentity, plan: LabPlan) -> None:
    per_ns: dict[str, list[str]] = {ident.netns(n.name): [] for n in plan.nodes}
    if plan.cables or plan.switch_ports:
        run(["ip", "netns", "add", ident.fabric_netns])
        per_ns[ident.fabric_netns] = []
    if plan.cables:
        _create_patch_panel(ident, plan, per_ns)
    if plan.switch_ports:
        _create_switch(ident, plan, per_ns)
    for node in plan.nodes:
        ns = ident.netns(node.name)
        # Empty cages: a persistent TAP shows DOWN/NO-CARRIER like a port with no cable.
        per_ns[ns] += [f"tuntap add dev {iface} mode tap" for iface in node.uncabled]
    for ns, commands in per_ns.items():
        ip_batch(commands, netns=ns)
    for node in plan.nodes:
        ns = ident.netns(node.name)
        ip_batch([f"link set {iface} up" for iface in node.cabled + node.uncabled], netns=ns)


def wait_carrier(ident: LabIdentity, plan: LabPlan, timeout: float = 10.0) -> None:
    """Carrier changes reach operstate asynchronously (linkwatch): wait until cables are UP."""
    deadline = time.monotonic() + timeout
    pending = {n.name: set(n.cabled) for n in plan.nodes}
    while pending and time.monotonic() < deadline:
        for node in list(pending):
            out = run(["ip", "-n", ident.netns(node), "-j", "link", "show"])
            up = {link["ifname"] for link in json.loads(out) if link.get("operstate") == "UP"}
            pending[node] -= up
            if not pending[node]:
                del pending[node]
        if pending:
            time.sleep(0.05)
    if pending:
        raise LabError(f"fabric links did not come up: {pending}", 1)


def cable_end_names(ident: LabIdentity, cable_index: int) -> tuple[str, str]:
    """The two patch-panel ports of a cable, in the fabric namespace."""
    return f"{ident.prefix}c{cable_index}a", f"{ident.prefix}c{cable_index}b"


def _create_patch_panel(ident: LabIdentity, plan: LabPlan, per_ns: dict[str, list[str]]) -> None:
    """Every cable runs through a two-port bridge in the fabric namespace, out of the nodes'
    reach. Pulling it (downing both panel ports) then looks as it does on a Spark: both node
    ends stay administratively up with their addresses but lose carrier, and nothing inside a
    node (networkd included) can plug it back in."""
    fabric = ident.fabric_netns
    commands = ["link set lo up"]
    ports: list[str] = []
    for index, cable in enumerate(plan.cables):
        a_end, b_end = cable_end_names(ident, index)
        bridge = f"{ident.prefix}c{index}"
        per_ns[ident.netns(cable.a)].append(
            f"link add {cable.a_if} type veth peer name {a_end} netns {fabric}")
        per_ns[ident.netns(cable.b)].append(
            f"link add {cable.b_if} type veth peer name {b_end} netns {fabric}")
        commands += [f"link add {bridge} type bridge", f"link set {bridge} mtu {FABRIC_SWITCH_MTU}",
                     f"link set {bridge} up"]
        ports += [f"link set {end} mtu {FABRIC_SWITCH_MTU} master {bridge} up"
                  for end in (a_end, b_end)]
    ip_batch(commands, netns=fabric)
    per_ns[fabric] += ports  # runs after the node batches created the peers


def _create_switch(ident: LabIdentity, plan: LabPlan, per_ns: dict[str, list[str]]) -> None:
    fabric = ident.fabric_netns
    commands = ["link set lo up"]
    twins = sorted({p.bridge_index for p in plan.switch_ports})
    for twin in twins:
        bridge = f"{ident.prefix}f{twin}"
        commands += [f"link add {bridge} type bridge", f"link set {bridge} mtu {FABRIC_SWITCH_MTU}",
                     f"link set {bridge} up"]
    index = {n.name: n.index for n in plan.nodes}
    ports: list[str] = []
    for port in plan.switch_ports:
        peer = switch_port_name(ident, index[port.node], port.bridge_index)
        per_ns[ident.netns(port.node)].append(
            f"link add {port.interface} type veth peer name {peer} netns {fabric}")
        ports.append(f"link set {peer} mtu {FABRIC_SWITCH_MTU} master "
                     f"{ident.prefix}f{port.bridge_index} up")
    ip_batch(commands, netns=fabric)
    per_ns[fabric] += ports  # runs after the node batches created the peers


def switch_port_name(ident: LabIdentity, node_index: int, twin: int) -> str:
    return f"{ident.prefix}n{node_index}t{twin}"


def delete_all(ident: LabIdentity, recorded_netns: list[str]) -> list[str]:
    """Remove the lab's namespaces (their devices go with them) and host links; say what went."""
    removed: list[str] = []
    present = netns_list()
    prefix = f"{ident.prefix}-"
    for ns in sorted(set(recorded_netns) | {n for n in present if n.startswith(prefix)}):
        if ns in present:
            run(["ip", "netns", "delete", ns], check=False)
            removed.append(f"netns {ns}")
    for link in host_links():
        if link == ident.bridge or (link.startswith(f"{ident.prefix}m") and
                                    link[len(ident.prefix) + 1:].isdigit()):
            run(["ip", "link", "delete", link], check=False)
            removed.append(f"link {link}")
    return removed
