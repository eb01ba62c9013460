"""A fabric network someone else configured, read as `init` finds it (pure).

NVIDIA Sync's Cluster Assistant writes /etc/netplan/99-nvidia-sync-cluster.yaml (both twins of
the cabled port, `dhcp4: false`, MTU 9000, one /24 per twin: 10.100.32.1/24, 10.100.33.1/24);
NVIDIA's manual playbooks and owners write their own (40-cx7.yaml). When netplan files other
than sparkctl's give the fabric interfaces addresses, `init` adopts that network as it is: the
inventory gets those addresses, their MTU and `fabric.network: adopted`, so `up` verifies them
and never writes a netplan file. It must be consistent first: the same interfaces addressed on
every node, one fixed IPv4 address each, applied, one MTU, and subnets that are either shared
by every node (back to back, a switch) or by the two ends of each ring link, agreeing with what
the cables reach. Anything else is refused, naming the node, file and interface.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict

from orchestrator.errors import InputError
from orchestrator.netcheck.cabling import PORTS
from orchestrator.netcheck.layout import Layout, Reach
from orchestrator.phases.adopted import Addressing, addressing
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import LINKS, NETPLAN_FILES, LinkTable

FABRIC_INTERFACES = PORTS["port 1"] + PORTS["port 0"]
REFUSED = ("init: the fabric's netplan files on these nodes are not one consistent network, so "
           "sparkctl cannot adopt it: ")
FIX = (" Fix the files (or run NVIDIA Sync's Cluster Assistant again) and `sudo netplan apply`, "
       "or remove them to let sparkctl write its own network (docs/up.md)")


def _refuse(what: str) -> InputError:
    return InputError(REFUSED + what + "." + FIX)


def adopt(hosts: list[str], facts: list[NodeFacts], reach: Reach) -> Layout | None:
    """The adopted Layout (topology, interfaces, addresses, MTU, files), None when no file other
    than sparkctl's addresses a fabric interface on any node, or InputError naming what is
    inconsistent."""
    found: list[dict[str, Addressing]] = []
    for answer in facts:
        files = NETPLAN_FILES.read(answer)
        found.append({iface: a for iface in FABRIC_INTERFACES
                      if (a := addressing(files, iface)) is not None})
    if not any(found):
        return None
    wanted = set(found[0])
    if any(set(f) != wanted for f in found):
        raise _refuse("the nodes address different fabric interfaces (" + "; ".join(
            f"{host}: " + (", ".join(f"{i} in {', '.join(a.files)}" for i, a in f.items())
                           or "none")
            for host, f in zip(hosts, found, strict=True)) + ")")
    interfaces = tuple(i for i in FABRIC_INTERFACES if i in wanted)
    addresses: list[dict[str, str]] = []
    mtus: dict[int, list[str]] = defaultdict(list)
    for host, answer, node_found in zip(hosts, facts, found, strict=True):
        links = (LINKS.read(answer) or LinkTable({})).links
        mine: dict[str, str] = {}
        for iface in interfaces:
            mine[iface] = _address(host, iface, node_found[iface])
            link = links.get(iface)
            where = ", ".join(node_found[iface].files)
            if link is None or mine[iface] not in link.addresses:
                has = ", ".join(link.addresses) if link else "no such interface"
                raise _refuse(f"{host}: {where} gives {iface} {mine[iface]} but the interface "
                              f"has {has or 'no address'} (not applied: `sudo netplan apply`)")
            file_mtu = node_found[iface].mtu or 1500
            if link.mtu != file_mtu:
                raise _refuse(f"{host}: {where} gives {iface} MTU {file_mtu} but it runs "
                              f"{link.mtu} (not applied: `sudo netplan apply`)")
            mtus[file_mtu].append(f"{host} {iface}")
        addresses.append(mine)
    if len(mtus) > 1:
        raise _refuse("the fabric interfaces run different MTUs (" + "; ".join(
            f"{mtu}: {', '.join(where)}" for mtu, where in sorted(mtus.items())) + ")")
    mtu = next(iter(mtus))
    topology = _topology(hosts, interfaces, addresses, reach)
    paths = sorted({path for f in found for a in f.values() for path in a.files})
    reason = (f"adopting the network of {', '.join(paths)} ({', '.join(interfaces)}, MTU {mtu}, "
              f"{'a ring' if topology == 'ring' else 'one subnet per interface'}): sparkctl "
              "verifies it and never rewrites it")
    port = next((name for name, twins in PORTS.items() if twins == interfaces), "")
    return Layout(topology, interfaces, addresses, reason, port, mtu, tuple(paths))


def _address(host: str, iface: str, found: Addressing) -> str:
    where = ", ".join(found.files)
    if found.dhcp:
        raise _refuse(f"{host}: {where} turns on {', '.join(found.dhcp)} for {iface}; the fabric "
                      "needs fixed addresses")
    if len(found.addresses) != 1:
        raise _refuse(f"{host}: {where} gives {iface} {len(found.addresses)} addresses "
                      f"({', '.join(found.addresses)}); one per interface")
    address = found.addresses[0]
    try:
        parsed = ipaddress.ip_interface(address)
    except ValueError:
        raise _refuse(f"{host}: {where} gives {iface} {address!r}, not an address/prefix") from None
    if parsed.version != 4 or "/" not in address:
        raise _refuse(f"{host}: {where} gives {iface} {address}; sparkctl adopts IPv4 "
                      "addresses with a prefix (10.100.32.1/24)")
    return address


def _topology(hosts: list[str], interfaces: tuple[str, ...], addresses: list[dict[str, str]],
              reach: Reach) -> str:
    """b2b / switch when every subnet holds every node, ring when each holds two; the cables
    (reach) must join the nodes each subnet puts together."""
    members: dict[ipaddress.IPv4Network | ipaddress.IPv6Network, list[tuple[int, str]]] = \
        defaultdict(list)
    for node, mine in enumerate(addresses):
        for iface in interfaces:
            members[ipaddress.ip_interface(mine[iface]).network].append((node, iface))
    for network, where in members.items():
        nodes = [node for node, _ in where]
        twice = next((node for node in nodes if nodes.count(node) > 1), None)
        if twice is not None:
            twins = ", ".join(iface for node, iface in where if node == twice)
            raise _refuse(f"{hosts[twice]}: {twins} share {network} (NVIDIA: one subnet on "
                          "two interfaces breaks routing and NCCL)")
    count = len(hosts)
    sizes = {len(where) for where in members.values()}
    if sizes == {count}:
        topology = "b2b" if count == 2 else "switch"
    elif sizes == {2} and count >= 3:
        topology = "ring"
    else:
        raise _refuse("its subnets join neither every node (back to back, a switch) nor the "
                      "two ends of each ring link (" + "; ".join(
                          f"{network}: {', '.join(f'{hosts[n]} {i}' for n, i in where)}"
                          for network, where in members.items()) + ")")
    if reach.probed:
        for where in members.values():
            for node, iface in where:
                others = {n for n, _ in where} - {node}
                seen = reach.peers[node].get(iface, frozenset())
                if not others <= seen:
                    names = ", ".join(hosts[n] for n in sorted(others - seen))
                    raise _refuse(f"{hosts[node]}: {iface} shares "
                                  f"{ipaddress.ip_interface(addresses[node][iface]).network} with "
                                  f"{names}, but its cable does not reach {names} "
                                  f"({reach.describe(node)})")
    return topology
