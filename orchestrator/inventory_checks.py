"""Loading an inventory file and the cross-field rules that catch broken clusters.

Pydantic checks each value; the rules here look across nodes and interfaces (duplicates,
twins sharing a subnet, a fabric interface that is the management one, ...). Every problem is
collected so the user fixes the file in one pass.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.errors import InputError
from orchestrator.inventory import Inventory, Node, derive_addresses
from orchestrator.yamlio import load_yaml_mapping

DEFAULT_INVENTORY = "two-sparks.yml"


def load_inventory(path: Path) -> Inventory:
    """Read, validate and complete (derived addresses) the inventory at `path`."""
    data = load_yaml_mapping(path, "inventory")
    return inventory_from_data(data, str(path))


def inventory_from_data(data: dict[str, Any], source: str) -> Inventory:
    if "container" in data:
        deprecation_note(source)
    try:
        inventory = Inventory.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise InputError(format_validation_error(exc, data, source)) from None
    inventory = _with_derived_addresses(inventory)
    problems = cross_check(inventory)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise InputError(f"{source}: invalid inventory:\n{lines}")
    return inventory


def deprecation_note(source: str) -> None:
    """One line on stderr: an inventory from before the engine sections still loads."""
    import sys

    from orchestrator.engines import DEFAULT_ENGINE

    print(f"note: {source}: top-level `container:` is deprecated; move it to "
          f"`engines: {{{DEFAULT_ENGINE}: {{container: ...}}}}` (its hf_cache to cluster.hf_cache); "
          "docs/inventory.md", file=sys.stderr)


def format_validation_error(exc: ValidationError, data: Any, source: str) -> str:
    lines = []
    for error in exc.errors():
        path = _key_path(error["loc"], data)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; docs/inventory.md lists every key)"
        elif error["type"] == "missing":
            message = "required key is missing"
        elif error["type"] == "string_pattern_mismatch":
            message = f"{error.get('input')!r} is not valid here ({_pattern_hint(path)})"
        lines.append(f"  - {path}: {message}")
    return f"{source}: invalid inventory:\n" + "\n".join(lines)


def _key_path(loc: tuple[Any, ...], data: Any) -> str:
    """Render ('nodes', 1, 'host') as nodes[1].host, naming the node when it has a name."""
    out = ""
    cursor = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            name = None
            if isinstance(cursor, list) and part < len(cursor) and isinstance(cursor[part], dict):
                name = cursor[part].get("name")
            if isinstance(name, str):
                out += f" ({name})"
        else:
            out += f".{part}" if out else str(part)
        try:
            cursor = cursor[part]
        except (KeyError, IndexError, TypeError):
            cursor = None
    return out or "(top level)"


def _pattern_hint(path: str) -> str:
    if path.endswith(".name") and path.startswith("nodes"):
        return "lower-case letters, digits and '-'"
    if "addresses" in path or "interfaces" in path or "interface" in path:
        return "a Linux interface name of at most 15 characters, e.g. enp1s0f1np1"
    if path.endswith("host"):
        return "a hostname or IP address"
    if path.endswith("image"):
        return "an image reference: registry/repository:tag or @sha256:..., lower-case"
    return "see docs/inventory.md"


def _with_derived_addresses(inventory: Inventory) -> Inventory:
    nodes = []
    for index, node in enumerate(inventory.nodes):
        if node.addresses is None:
            node = node.model_copy(
                update={"addresses": derive_addresses(index, inventory.fabric.interfaces)}
            )
        nodes.append(node)
    return inventory.model_copy(update={"nodes": nodes})


def cross_check(inventory: Inventory) -> list[str]:
    """Every rule that needs more than one value, as a list of messages (empty when fine)."""
    problems: list[str] = []
    nodes = inventory.nodes
    problems += _duplicates("nodes[].name", [n.name for n in nodes])
    problems += _duplicates("nodes[].host", [n.host for n in nodes])
    if inventory.cluster.management_interface in inventory.fabric.interfaces:
        problems.append(
            f"fabric.interfaces: {inventory.cluster.management_interface} is the management "
            "interface (cluster.management_interface); sparkctl never reconfigures it. "
            "List only the cabled QSFP interfaces, e.g. enp1s0f1np1, enP2p1s0f1np1"
        )
    names = [n.name for n in nodes]
    if inventory.cluster.head and inventory.cluster.head not in names:
        problems.append(
            f"cluster.head: {inventory.cluster.head!r} is not a node (nodes: {', '.join(names)})"
        )
    heads = [n.name for n in nodes if n.head]
    if len(heads) > 1:
        problems.append(f"nodes[].head: only one node may be the head, found {', '.join(heads)}")
    if inventory.cluster.head and heads and heads != [inventory.cluster.head]:
        problems.append(f"cluster.head ({inventory.cluster.head}) and nodes[].head ({heads[0]}) disagree")
    all_ips: list[str] = []
    for i, node in enumerate(nodes):
        node_problems, ips = _check_node_addresses(i, node, inventory.fabric.interfaces)
        problems += node_problems
        all_ips += ips
    problems += _duplicates("nodes[].addresses", all_ips)
    if inventory.topology != "ring" and not problems:
        problems += _check_shared_subnets(inventory)
    if inventory.topology == "b2b" and len(nodes) != 2:
        problems.append(f"fabric.topology: b2b cables exactly two nodes, found {len(nodes)}")
    return problems


def _duplicates(key: str, values: list[str]) -> list[str]:
    seen: set[str] = set()
    repeated = sorted({v for v in values if v in seen or seen.add(v)})  # type: ignore[func-returns-value]
    return [f"{key}: {v!r} appears more than once" for v in repeated]


def _check_node_addresses(
    index: int, node: Node, interfaces: list[str]
) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    ips: list[str] = []
    where = f"nodes[{index}] ({node.name}).addresses"
    addresses = node.addresses or {}
    for name in interfaces:
        if name not in addresses:
            problems.append(f"{where}: no address for fabric interface {name}")
    networks: dict[str, ipaddress.IPv4Network] = {}
    for name, cidr in addresses.items():
        if name not in interfaces:
            problems.append(
                f"{where}.{name}: not a fabric interface (fabric.interfaces: {', '.join(interfaces)})"
            )
            continue
        try:
            iface = ipaddress.IPv4Interface(cidr)
        except ValueError:
            problems.append(
                f"{where}.{name}: {cidr!r} is not an IPv4 address with a prefix, e.g. 192.168.200.12/24"
            )
            continue
        if "/" not in cidr:
            problems.append(f"{where}.{name}: {cidr!r} has no prefix length; write e.g. {cidr}/24")
            continue
        net = iface.network
        if net.prefixlen < 31 and iface.ip in (net.network_address, net.broadcast_address):
            problems.append(
                f"{where}.{name}: {cidr} is not a host address in {net}; use one between "
                f"{net.network_address + 1} and {net.broadcast_address - 1}"
            )
        if iface.ip.is_loopback or iface.ip.is_multicast or iface.ip.is_unspecified:
            problems.append(f"{where}.{name}: {cidr} cannot be a fabric address")
        for other, other_net in networks.items():
            if other_net.overlaps(net):
                problems.append(
                    f"{where}: twins {other} and {name} share subnet {net}; each fabric interface "
                    "needs its own subnet (one subnet on two interfaces breaks routing and NCCL)"
                )
        networks[name] = net
        ips.append(str(iface.ip))
    return problems, ips


def _check_shared_subnets(inventory: Inventory) -> list[str]:
    """Without a ring, the same interface must be in the same subnet on every node."""
    problems: list[str] = []
    for name in inventory.fabric.interfaces:
        first = inventory.nodes[0]
        expected = ipaddress.IPv4Interface(first.addresses[name]).network  # type: ignore[index]
        for i, node in enumerate(inventory.nodes[1:], start=1):
            network = ipaddress.IPv4Interface(node.addresses[name]).network  # type: ignore[index]
            if network != expected:
                problems.append(
                    f"nodes[{i}] ({node.name}).addresses.{name}: {node.addresses[name]} is outside "  # type: ignore[index]
                    f"{expected}, the subnet {first.name} uses on {name}; peers on one cable or "
                    "switch must share its subnet"
                )
    return problems


def resolve_inventory_path(option: str | None, state_dir: Path) -> Path:
    """--inventory > $SPARKCTL_INVENTORY > last successful `up` > ./two-sparks.yml."""
    if option:
        return Path(option)
    env = os.environ.get("SPARKCTL_INVENTORY")
    if env:
        return Path(env)
    remembered = state_dir / "last-inventory"
    try:
        last = remembered.read_text().strip()
    except OSError:
        last = ""
    if last and Path(last).exists():
        return Path(last)
    return Path(DEFAULT_INVENTORY)
