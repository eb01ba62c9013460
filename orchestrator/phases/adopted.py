"""An adopted fabric network (`fabric.network: adopted`): netplan files sparkctl did not write
(NVIDIA Sync's /etc/netplan/99-nvidia-sync-cluster.yaml, NVIDIA's manual 40-cx7.yaml, your own)
already give the fabric its addresses and MTU. sparkctl then writes no netplan file of its own,
never rewrites or removes theirs (`up` leaves them byte for byte, `down --network` leaves them
and says so) and only verifies: preflight refuses an inventory the live network does not match,
and the "network" phase of `up` proves it, naming the files (pure over the gathered facts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.core.step import NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import NETPLAN_FILE
from orchestrator.phases.netplan_conflicts import targets_interface
from orchestrator.remote.facts import request_of
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import LINKS, NETPLAN_FILES, LinkTable, NetplanFile


@dataclass(frozen=True)
class Addressing:
    """What the other netplan files say about one interface (those that address it)."""

    files: tuple[str, ...]
    addresses: tuple[str, ...]
    dhcp: tuple[str, ...]
    mtu: int | None


def addressing(files: dict[str, NetplanFile], iface: str) -> Addressing | None:
    """The addresses, DHCP and MTU files other than sparkctl's give IFACE; None when none of
    them addresses it (a definition that only names it, or sets link-local, is no addressing)."""
    paths: list[str] = []
    addresses: list[str] = []
    dhcp: list[str] = []
    mtu: int | None = None
    for path, fact in sorted(files.items()):
        if path == NETPLAN_FILE:
            continue
        for key, definition in sorted(fact.definitions.items()):
            if not targets_interface(key, definition, iface):
                continue
            flags = [flag for flag, on in (("dhcp4", definition.dhcp4),
                                           ("dhcp6", definition.dhcp6)) if on]
            if not definition.addresses and not flags:
                continue
            paths.append(path)
            addresses += [a for a in definition.addresses if a not in addresses]
            dhcp += flags
            mtu = definition.mtu if definition.mtu is not None else mtu
    if not paths:
        return None
    return Addressing(tuple(dict.fromkeys(paths)), tuple(addresses), tuple(dhcp), mtu)


def adopted_problems(inventory: Inventory, node: Node, facts: NodeFacts) -> list[str]:
    """Why the adopted network does not hold on NODE (empty when it does): every fabric
    interface's inventory address must come from another netplan file and be live, at the MTU."""
    files = NETPLAN_FILES.read(facts)
    links = (LINKS.read(facts) or LinkTable({})).links
    mtu = inventory.fabric.mtu
    problems = []
    for iface in inventory.fabric.interfaces:
        wanted = (node.addresses or {})[iface]
        found = addressing(files, iface)
        link = links.get(iface)
        if found is None or wanted not in found.addresses:
            said = (f"{', '.join(found.files)} give {', '.join(found.addresses) or 'no address'}"
                    if found else "no netplan file on the node addresses it")
            problems.append(
                f"fabric.network is adopted, but {iface} {wanted} is not in a netplan file "
                f"({said}); sparkctl does not write the network it adopts: run `sparkctl init` "
                "again to read the network as it is, or drop `network: adopted` to let sparkctl "
                "write its own")
            continue
        where = ", ".join(found.files)
        if found.dhcp or len(found.addresses) > 1:
            extra = [a for a in found.addresses if a != wanted] + [f"{f}: true" for f in found.dhcp]
            problems.append(f"{where} also gives {iface} {', '.join(extra)}: an adopted fabric "
                            "needs one fixed address per interface")
        if link is None:
            problems.append(f"fabric interface {iface} does not exist")
        elif wanted not in link.addresses:
            problems.append(f"{iface} lacks {wanted}, which {where} gives it "
                            f"(has {', '.join(link.addresses) or 'none'}): run "
                            f"`sudo netplan apply` on {node.name}")
        elif link.mtu != mtu:
            problems.append(f"{iface} runs MTU {link.mtu}, the inventory says fabric.mtu {mtu} "
                            f"({where} says {found.mtu or 'nothing, so 1500'}): set the same "
                            "MTU in both")
    return problems


def adopted_files(inventory: Inventory, facts: NodeFacts) -> list[str]:
    """The netplan files that give the adopted fabric its addresses."""
    files = NETPLAN_FILES.read(facts)
    return sorted({path for iface in inventory.fabric.interfaces
                   for path in getattr(addressing(files, iface), "files", ())})


def adopted_note(ctx: NodeContext) -> str:
    """What `down --network` leaves of an adopted network, and why."""
    kept = adopted_files(ctx.inventory, ctx.facts)
    return (f"left alone: the adopted network (fabric.network: adopted): "
            f"{', '.join(kept) or 'its netplan files'} and the fabric addresses they give; "
            "sparkctl did not write them")


def phase(inventory: Inventory) -> Phase:
    return Phase("network", [AdoptedNetwork()],
                 facts=lambda inventory, node: request_of(NETPLAN_FILES, LINKS))


class AdoptedNetwork(Step):
    """The adopted network as it is: verified, never written."""

    name = "adopted"

    def check(self, ctx: NodeContext) -> Outcome:
        problems = adopted_problems(ctx.inventory, ctx.node, ctx.facts)
        if problems:
            raise SparkctlError(f"{ctx.node.name}: network/adopted: " + "; ".join(problems))
        where = adopted_files(ctx.inventory, ctx.facts)
        live = ", ".join(f"{iface} {(ctx.node.addresses or {})[iface]}"
                         for iface in ctx.inventory.fabric.interfaces)
        return Unchanged(f"adopted network ({', '.join(where)}): {live}, MTU "
                         f"{ctx.inventory.fabric.mtu} live; sparkctl writes no netplan file")

    def apply(self, ctx: NodeContext, change: Any) -> str | None:  # never called: check never changes
        return None
