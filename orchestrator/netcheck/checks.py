"""netcheck's checks: pure functions from gathered facts to CheckResult records.

Each check is one small function over one node's facts (NODE_CHECKS) or every node's facts
(CLUSTER_CHECKS); link probes (pings, SSH, mpirun, iperf3) are judged in netprobe.py. A check
never talks to a node, so every one of them is unit-tested with faked facts. To add a check,
write a function with the same signature and list it below.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.commands import join
from orchestrator.inventory import Inventory, Node
from orchestrator.netcheck.results import CheckResult, _link
from orchestrator.netcheck.roce import check_roce, roce_request
from orchestrator.paths import NETPLAN_FILE, SSH_CONFIG
from orchestrator.remote.gathered import NodeFacts

EXPECTED_SPEED_MBPS = 200000  # a ConnectX-7 QSFP port on a DGX Spark


@dataclass(frozen=True)
class Link:
    """One direction of a fabric link: `node` reaches `peer_ip` (on `peer`) through `interface`."""

    node: str
    interface: str
    local_ip: str
    peer: str
    peer_interface: str
    peer_ip: str


def fabric_links(inventory: Inventory) -> list[Link]:
    """Every (node, interface) -> peer address on the same subnet; both directions appear.

    Matching on subnets, not on interface names, covers b2b, switch and ring alike.
    """
    links: list[Link] = []
    for node in inventory.nodes:
        for interface, cidr in (node.addresses or {}).items():
            network = ipaddress.ip_interface(cidr).network
            for peer in inventory.nodes:
                if peer.name == node.name:
                    continue
                for peer_interface, peer_cidr in (peer.addresses or {}).items():
                    peer_address = ipaddress.ip_interface(peer_cidr)
                    if peer_address.ip in network:
                        links.append(Link(node.name, interface, cidr.split("/")[0], peer.name,
                                          peer_interface, str(peer_address.ip)))
    return links


# ---------------------------------------------------------------- per-node checks

NodeCheck = Callable[[Inventory, Node, NodeFacts], list[CheckResult]]


def check_interface_up(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    out = []
    roce = facts.roce.ports
    for interface in inventory.fabric.interfaces:
        link = _link(facts, interface)
        result = CheckResult("interface", node.name, "pass", "", interface=interface)
        if link is None:
            result.status, result.message = "fail", f"{interface} does not exist on {node.name}."
            result.fix = (f"check fabric.interfaces in the inventory against `ip link` on {node.name} "
                          "(Spark port 1 is enp1s0f1np1 + enP2p1s0f1np1)")
        elif not link.up:
            result.status, result.value = "fail", link.operstate
            state = port.state if (port := roce.get(interface)) else None
            shown = f", ibdev2netdev: {state}" if state else ""
            result.message = (f"{interface} on {node.name} is down (ip link: DOWN{shown}): it was "
                              "set down, or its cable was pulled and the port disabled.")
            result.fix = (f"check the QSFP cable in that port; `sudo ip link set {interface} up` on "
                          f"{node.name}, or re-run `sparkctl up`")
        elif not link.carrier or link.operstate not in ("UP", "UNKNOWN"):
            result.status, result.value = "fail", link.operstate
            state = port.state if (port := roce.get(interface)) else None
            shown = f" (ibdev2netdev: {state})" if state else ""
            result.message = (f"{interface} on {node.name} has no carrier{shown}: the cable is "
                              "unplugged or cut, or the peer's port is down.")
            result.fix = (f"check the QSFP cable in {node.name}'s port for {interface} and that the "
                          "peer's twin interface is up")
        else:
            result.value = "UP"
            result.message = f"{interface} is up with carrier."
        out.append(result)
    return out


def _parse_speed(text: str) -> int | None:
    match = re.search(r"Speed:\s*(\d+)\s*Mb/s", text)
    return int(match.group(1)) if match else None


def negotiated_speed(facts: NodeFacts, interface: str) -> int | None:
    """Mb/s ethtool says INTERFACE negotiated (None: not gathered or no Speed: line)."""
    return _parse_speed(facts.output(f"ethtool:{interface}"))


def check_speed(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    out = []
    for interface in inventory.fabric.interfaces:
        answer = facts.command(f"ethtool:{interface}")
        speed = _parse_speed(answer.out if answer else "")
        result = CheckResult("speed", node.name, "pass", "", interface=interface, value=speed,
                             unit="Mb/s", threshold=EXPECTED_SPEED_MBPS)
        link = _link(facts, interface)
        if link is None or not link.up or not link.carrier:
            continue  # the interface check already failed it; a down link has no speed
        if speed is None:
            result.status = "warn"
            said = (answer.err if answer else "").strip()[-120:] or "no Speed: line"
            result.message = f"ethtool reports no speed for {interface} ({said})."
            result.fix = "install ethtool on the node; a down link also has no speed"
        elif speed < EXPECTED_SPEED_MBPS:
            result.status = "warn"
            result.message = (f"{interface} negotiated {speed} Mb/s, below the ConnectX-7's "
                              f"{EXPECTED_SPEED_MBPS} Mb/s.")
            result.fix = "reseat or replace the QSFP cable; `sparkctl netcheck --deep` measures the link"
        else:
            result.message = (f"{interface} negotiated {speed} Mb/s (ethtool can say 200G on a "
                              "degraded link: --deep measures it).")
        out.append(result)
    return out


def check_addresses(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    out = []
    for interface in inventory.fabric.interfaces:
        link = _link(facts, interface)
        if link is None:
            continue
        expected = (node.addresses or {}).get(interface)
        found = list(link.addresses)
        result = CheckResult("address", node.name, "pass", "", interface=interface,
                             value=",".join(found) or None, threshold=expected)
        if expected not in found:
            result.status = "fail"
            result.message = (f"{interface} on {node.name} should have {expected} but has "
                              f"{', '.join(found) or 'no IPv4 address'}: changed by hand, by another "
                              "tool's netplan file, or never applied.")
            result.fix = ("`sparkctl up` re-applies the fabric netplan (with rollback); check "
                          "/etc/netplan for other files naming this interface")
        elif len(found) > 1:
            result.status = "warn"
            result.message = (f"{interface} has extra addresses besides {expected}: "
                              f"{', '.join(a for a in found if a != expected)}.")
            result.fix = f"remove them (`sudo ip addr del ADDR dev {interface}`) or find the tool adding them"
        else:
            result.message = f"{interface} has {expected}."
        out.append(result)
    return out


def check_mtu(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    out = []
    want = inventory.fabric.mtu
    for interface in inventory.fabric.interfaces:
        link = _link(facts, interface)
        if link is None:
            continue
        mtu = link.mtu
        result = CheckResult("mtu", node.name, "pass", f"{interface} MTU is {mtu}.",
                             interface=interface, value=mtu, threshold=want)
        if mtu != want:
            result.status = "fail"
            result.message = (f"{interface} on {node.name} has MTU {mtu}, the inventory says {want}: "
                              "large packets are dropped and NCCL stalls or slows down.")
            result.fix = "`sparkctl up` sets the fabric MTU on every node (both ends must match)"
        out.append(result)
    return out


def check_netplan(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    """Whether sparkctl's file configures each fabric interface, and whether another file sets
    addresses or DHCP on it (up's preflight rule: a file that only names it is harmless)."""
    from orchestrator.phases.netplan_conflicts import conflicts

    if inventory.fabric.network == "adopted":
        return _check_adopted(inventory, node, facts)
    out = []
    ours_file = facts.netplan.get(NETPLAN_FILE)
    clashing = conflicts(inventory, node, facts)
    for interface in inventory.fabric.interfaces:
        ours = interface in (ours_file.interfaces if ours_file else ())
        others = [(path, setting) for path, found, _ in clashing for setting in found
                  if setting.iface == interface]
        result = CheckResult("netplan", node.name, "pass", "", interface=interface,
                             value=",".join(sorted({path for path, _ in others})) or None)
        if others:
            result.status = "warn"
            said = "; ".join(f"{path} sets {setting.what()}" for path, setting in others)
            result.message = (f"{said} on {interface}: netplan merges files, so those settings "
                              "fight sparkctl's on the next `netplan apply` or reboot.")
            result.fix = f"remove {interface} from those files (sparkctl never edits them)"
        elif not ours:
            result.status = "warn"
            result.message = (f"{NETPLAN_FILE} does not configure {interface}: the live "
                              "settings will not survive a reboot.")
            result.fix = "run `sparkctl up`"
        else:
            result.message = f"only {NETPLAN_FILE} configures {interface}."
        out.append(result)
    return out


def _check_adopted(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    """fabric.network: adopted: another file gives each interface its inventory address."""
    from orchestrator.phases.adopted import addressing, adopted_problems
    from orchestrator.remote.node_facts import NETPLAN_FILES

    files = NETPLAN_FILES.read(facts)
    out = []
    for interface in inventory.fabric.interfaces:
        node_only = node.model_copy(update={"addresses": {
            interface: (node.addresses or {})[interface]}})
        only = inventory.model_copy(update={"fabric": inventory.fabric.model_copy(
            update={"interfaces": [interface]})})
        problems = adopted_problems(only, node_only, facts)
        found = addressing(files, interface)
        result = CheckResult("netplan", node.name, "pass", "", interface=interface,
                             value=",".join(found.files) if found else None)
        if problems:
            result.status = "fail"
            result.message = "; ".join(problems)
            result.fix = "run `sparkctl init` again, or fix the adopted file and `sudo netplan apply`"
        else:
            result.message = (f"adopted: {', '.join(found.files) if found else '?'} gives "
                              f"{interface} {(node.addresses or {})[interface]} (sparkctl writes none)")
        out.append(result)
    return out


def check_twin_subnets(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    """NVIDIA: twins on one subnet make routing ambiguous and NCCL fail."""
    networks: dict[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]] = {}
    for interface in inventory.fabric.interfaces:
        link = _link(facts, interface)
        networks[interface] = [ipaddress.ip_interface(a).network for a in (link.addresses if link else ())]
    clashes = []
    names = list(networks)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            shared = {str(n) for n in networks[first] for m in networks[second] if n.overlaps(m)}
            clashes += [f"{first} and {second} share {net}" for net in sorted(shared)]
    if len(names) < 2:
        return []
    if clashes:
        return [CheckResult(
            "twin-subnets", node.name, "fail",
            f"{'; '.join(clashes)} on {node.name}: the kernel may route one twin's traffic "
            "out of the other, and NCCL fails.",
            fix="give each twin its own subnet (fabric addresses in the inventory; the default "
                "plan uses 192.168.200.0/24 and 192.168.201.0/24), then `sparkctl up`",
        )]
    return [CheckResult("twin-subnets", node.name, "pass", "each fabric interface has its own subnet.")]


def check_routes(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    out = []
    routes = facts.routes
    for link in fabric_links(inventory):
        if link.node != node.name:
            continue
        dev = routes.get(link.peer_ip)
        result = CheckResult("route", node.name, "pass", "", peer=link.peer,
                             interface=link.interface, value=dev, threshold=link.interface)
        if dev != link.interface:
            result.status = "fail"
            where = f"leaves through {dev}" if dev else "has no route"
            result.message = (f"{link.peer_ip} ({link.peer}) {where} on {node.name}, expected "
                              f"{link.interface}: traffic to the peer takes the wrong path.")
            result.fix = (f"check `ip route get {link.peer_ip}` on {node.name}; an address on "
                          "another interface in the same subnet, or a missing address, causes this")
        else:
            result.message = f"{link.peer_ip} is routed through {link.interface}."
        out.append(result)
    return out


def check_disk(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    """A full disk or read-only filesystem where sparkctl writes (state, config, netplan)."""
    from orchestrator.core.disks import space_problems

    return [CheckResult("disk", node.name, "fail", f"{problem}.",
                        fix="free some space on the node (or remount it read-write)")
            for problem in space_problems(facts)]


NODE_CHECKS: list[NodeCheck] = [
    check_interface_up, check_speed, check_addresses, check_mtu, check_netplan,
    check_twin_subnets, check_routes, check_disk, check_roce,
]


def run_node_checks(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    from orchestrator.netcheck.container import CONTAINER_CHECKS

    out: list[CheckResult] = []
    for check in [*NODE_CHECKS, *CONTAINER_CHECKS]:
        out += check(inventory, node, facts)
    return out


def facts_request(inventory: Inventory, node: Node) -> dict[str, Any]:
    """Everything the per-node checks read, answered by the gatherer in one command."""
    from orchestrator.netcheck import container
    from orchestrator.remote.facts import merge_requests

    peers = sorted({link.peer_ip for link in fabric_links(inventory) if link.node == node.name})
    return merge_requests([{
        "links": True,
        "netplan": True,
        "ibdev2netdev": True,
        "routes": peers,
        "files": {SSH_CONFIG: False},
        "commands": {f"ethtool:{i}": join(["ethtool", i]) for i in inventory.fabric.interfaces},
        "timeout": 10,
    }, container.facts_request(inventory, node), roce_request(inventory, node)])


def summary(results: list[CheckResult]) -> dict[str, int]:
    counts = {"pass": 0, "warn": 0, "fail": 0, "skip": 0}
    for result in results:
        counts[result.status] += 1
    return counts
