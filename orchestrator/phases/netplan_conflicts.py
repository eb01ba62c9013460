"""Other netplan files that address the fabric interfaces (pure, from the gatherer's `netplan`
fact): found in preflight, before `up` applies anything.

netplan merges every file in /etc/netplan, so a file that already gives a fabric interface other
addresses (NVIDIA's playbook puts both twins in one /24) or DHCP puts those next to sparkctl's:
the fabric check after `netplan apply` then fails and the apply is rolled back, looking like a
cabling fault. A definition that only names an interface (no addresses, DHCP off) is harmless,
as is one holding exactly the inventory's address; sparkctl's own file is not another file.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from dataclasses import dataclass

from orchestrator.inventory import Inventory, Node
from orchestrator.paths import NETPLAN_FILE
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import NETPLAN_FILES, NetplanDefinition


def targets_interface(key: str, definition: NetplanDefinition, iface: str) -> bool:
    """Whether a definition (by its id, match.name glob or set-name) configures IFACE."""
    if definition.set_name == iface:
        return True
    if definition.match is not None:
        return fnmatch.fnmatchcase(iface, definition.match)
    return key == iface and not definition.matches_other


@dataclass(frozen=True)
class Setting:
    """What one definition of another file sets on a fabric interface, beyond the inventory."""

    iface: str
    key: str
    """The definition's id (the interface's name, or another id that matches it)."""
    addresses: tuple[str, ...]
    dhcp: tuple[str, ...]

    def label(self) -> str:
        return self.iface if self.key == self.iface else f"{self.iface} (as {self.key})"

    def what(self) -> str:
        return ", ".join([*self.addresses, *(f"{flag}: true" for flag in self.dhcp)])


def conflicts(inventory: Inventory, node: Node, facts: NodeFacts
              ) -> list[tuple[str, list[Setting], list[str]]]:
    """[(file, what it sets on fabric interfaces, the file's other definitions)] per
    conflicting file."""
    wanted = node.addresses or {}
    out = []
    for path, fact in sorted(NETPLAN_FILES.read(facts).items()):
        if path == NETPLAN_FILE:
            continue
        definitions = fact.definitions
        found: list[Setting] = []
        used: set[str] = set()
        for iface in inventory.fabric.interfaces:
            for key, definition in sorted(definitions.items()):
                if not targets_interface(key, definition, iface):
                    continue
                extra = tuple(a for a in definition.addresses if a != wanted.get(iface))
                dhcp = tuple(flag for flag, on in (("dhcp4", definition.dhcp4),
                                                   ("dhcp6", definition.dhcp6)) if on)
                if extra or dhcp:
                    found.append(Setting(iface, key, extra, dhcp))
                    used.add(key)
        if found:
            out.append((path, found, sorted(set(definitions) - used)))
    return out


def _shared_subnet(found: list[Setting]) -> str:
    networks: dict[str, list[str]] = {}
    for setting in found:
        for address in setting.addresses:
            try:
                network = str(ipaddress.ip_interface(address).network)
            except ValueError:
                continue
            networks.setdefault(network, []).append(setting.label())
    shared = [f"{', '.join(ifaces)} share {net}" for net, ifaces in networks.items() if len(ifaces) > 1]
    return (f" ({'; '.join(shared)}: one subnet on two interfaces breaks routing and NCCL)"
            if shared else "")


def conflict_problems(inventory: Inventory, node: Node, facts: NodeFacts) -> list[str]:
    """Preflight problems, one per file, naming the file, interfaces, addresses and the fix."""
    problems = []
    wanted = node.addresses or {}
    for path, found, others in conflicts(inventory, node, facts):
        ifaces = sorted({setting.iface for setting in found})
        listed = "; ".join(f"{setting.label()}: {setting.what()}" for setting in found)
        ours = ", ".join(f"{i} {wanted.get(i)}" for i in ifaces)
        remove = (f"delete it (it holds nothing else): `sudo rm {path}`" if not others else
                  f"remove {', '.join(ifaces)} from it (keep {', '.join(others)})")
        problems.append(
            f"{path} already configures the fabric: {listed}{_shared_subnet(found)}. netplan "
            f"merges it with sparkctl's {NETPLAN_FILE} (which sets {ours}), so the fabric check "
            "after `netplan apply` would fail and roll back. Fix on "
            f"{node.name}: {remove}, then `sudo netplan apply` (addresses left on the links: "
            f"`sudo ip addr flush dev IFACE`), then run `sparkctl up` again; or, if those "
            "addresses are the ones you want, put them in the inventory as the `addresses:` of "
            f"node {node.name} (each fabric interface in its own subnet)")
    return problems
