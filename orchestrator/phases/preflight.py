"""Phase "preflight": read-only checks on every node before anything changes.

One step per node collects EVERY problem of that node, so one run lists all of them. Any
problem fails the step; the executor then stops after this phase, so nothing changes anywhere.
Then, on the head, the image: a node that lacks it and cannot reach its registry (probed in the
same facts, phases/registry.py) is said to get it over the fabric, or, when no node has it or
can pull it, the run stops here naming node, registry and fix.
Reachability and sudo are proven by the facts gathering itself (a node that cannot be reached
or cannot sudo fails at connect/facts, before this step).
"""

from __future__ import annotations

import ipaddress
import time
from typing import Any

from orchestrator.commands import quote
from orchestrator.core.step import NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.phases.adopted import adopted_problems
from orchestrator.phases.nccl_env import ring_nccl_fact, ring_nccl_warning
from orchestrator.phases.netplan_conflicts import conflict_problems
from orchestrator.phases.registry import RegistryCheck, probe_fact
from orchestrator.remote.facts import (
    Command,
    CommandResult,
    merge_requests,
    request_of,
)
from orchestrator.remote.gathered import DiskEntry, NodeFacts
from orchestrator.remote.node_facts import LINKS, NETPLAN_FILES, ROCE_PORTS, DockerImage, LinkTable

MIN_FREE_BYTES = 20 * 10**9
MAX_CLOCK_SKEW_SECONDS = 60.0
MIN_PYTHON = (3, 8)
DOCKER_DIR = "/var/lib/docker"


def phase(inventory: Inventory) -> Phase:
    # then, on the head: every node can pull the image or gets it from one that has it
    image = inventory.up_image
    steps: list[Step] = [PreflightChecks()]
    if image:
        steps.append(RegistryCheck(lambda ctx: image))
    return Phase("preflight", steps, facts=preflight_request)


def preflight_request(inventory: Inventory, node: Node) -> dict[str, Any]:
    request = _base_request(inventory, node)
    image = inventory.up_image
    if inventory.topology == "ring" and image:
        request["commands"].update(ring_nccl_fact(image))
    return request


DOCKER = Command("docker", "docker version --format '{{.Server.Version}}'")
NETPLAN = Command("netplan", "PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin; command -v netplan")


def groups_fact(user: str) -> Command:
    return Command("groups", f"id -nG {quote(user)}")


def _base_request(inventory: Inventory, node: Node) -> dict[str, Any]:
    image = inventory.up_image
    typed = request_of(DOCKER, NETPLAN, groups_fact(inventory.cluster.user),
                       *((DockerImage(image), probe_fact(image)) if image else ()),
                       LINKS, ROCE_PORTS,
                       NETPLAN_FILES)  # (other netplan files that address the fabric interfaces)
    return merge_requests([typed, {
        "python": True,
        "resolve": [node.host],
        "disk": [DOCKER_DIR],
    }])


def _command(facts: NodeFacts, fact: Command) -> CommandResult:
    return fact.read(facts) or CommandResult(127, "", "not run")


def _tail(result: CommandResult) -> str:
    lines = (result.err or result.out or "").strip().splitlines()
    return lines[-1] if lines else "no output"


def check_docker(inventory: Inventory, facts: NodeFacts) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    notes: list[str] = []
    docker = _command(facts, DOCKER)
    if not docker.ok:
        problems.append(f"docker is not usable (`docker version` exited {docker.rc}: {_tail(docker)}); "
                        "install Docker and start its daemon")
    else:
        notes.append(f"docker {docker.out.strip()}")
    user = inventory.cluster.user
    groups = _command(facts, groups_fact(user))
    if user != "root":
        if not groups.ok:
            problems.append(f"user {user} does not exist on the node ({_tail(groups)})")
        elif "docker" not in groups.out.split():
            problems.append(f"user {user} is not in the docker group: run `sudo usermod -aG docker "
                            f"{user}` on the node, then log in again")
    image = inventory.up_image
    if image is None:
        return problems, notes
    # (an inspect error reads as not present, said below)
    present = DockerImage(image).read(facts, strict=False)
    if present is not None:
        digest = (present.repo_digests or (present.id or "?",))[0]
        notes.append(f"image present ({str(digest)[-19:]})")
    else:
        notes.append(f"image {image} not present yet (pulled in the container phase)")
    return problems, notes


def check_fabric(inventory: Inventory, facts: NodeFacts) -> list[str]:
    """Every fabric interface exists and its RoCE port is Up (the cable is in that port)."""
    problems: list[str] = []
    table = LINKS.read(facts) or LinkTable({})
    links = table.links
    roce = ROCE_PORTS.read(facts)
    devices = roce.ports
    up_ports = sorted(name for name, dev in devices.items() if dev.up)
    hint = (f"ports with a cable (ibdev2netdev Up): {', '.join(up_ports)}; if the cable is in the "
            "other port, list those in fabric.interfaces" if up_ports else
            "ibdev2netdev shows no port Up: is the QSFP cable plugged in on both ends?")
    if table.error is not None:
        return [f"cannot list interfaces: `ip -j addr` failed: {table.error}"]
    for iface in inventory.fabric.interfaces:
        if iface not in links:
            problems.append(f"fabric interface {iface} does not exist (interfaces: "
                            f"{', '.join(sorted(n for n in links if n != 'lo'))}); check "
                            "fabric.interfaces in the inventory")
            continue
        device = devices.get(iface)
        if roce.rc != 0 and not devices:
            if not links[iface].carrier:
                problems.append(f"fabric interface {iface} has no carrier (ibdev2netdev is not "
                                "available to say more): is the QSFP cable in this port?")
            continue
        if device is None:
            problems.append(f"fabric interface {iface} is not a RoCE port (ibdev2netdev does not "
                            f"list it); {hint}")
        elif not device.up:
            problems.append(f"fabric interface {iface} is Down (ibdev2netdev: {device.device} "
                            f"==> {iface} ({device.state})): is the QSFP cable in this port? {hint}")
    return problems


def management_interface(node: Node, facts: NodeFacts) -> tuple[str | None, list[str]]:
    """The interface holding the address node.host resolves to ON the node (None if unknown)."""
    resolved = list(facts.resolve.get(node.host) or [])
    wanted = set()
    for address in resolved:
        try:
            wanted.add(str(ipaddress.ip_address(address.split("%")[0])))
        except ValueError:
            continue
    for name, link in sorted((LINKS.read(facts) or LinkTable({})).links.items()):
        for cidr in link.addresses:
            if cidr.split("/")[0] in wanted:
                return name, resolved
    return None, resolved


def check_management(inventory: Inventory, node: Node, facts: NodeFacts) -> tuple[list[str], list[str]]:
    name, resolved = management_interface(node, facts)
    if name is None:
        where = f"resolves to {', '.join(resolved)}" if resolved else "does not resolve"
        return [], [f"could not tell the management interface ({node.host} {where} on the node and no "
                    "interface holds it; NAT or a proxy?)"]
    if name in inventory.fabric.interfaces:
        return [f"the management connection ({node.host}) runs over fabric interface {name}; "
                "sparkctl would cut its own session. Connect through the management port "
                f"({inventory.cluster.management_interface}) or take {name} out of fabric.interfaces"], []
    notes = [f"management on {name}"]
    if name != inventory.cluster.management_interface:
        notes.append(f"(cluster.management_interface says {inventory.cluster.management_interface})")
    return [], notes


def check_system(facts: NodeFacts, now: float) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    notes: list[str] = []
    netplan = _command(facts, NETPLAN)
    if not netplan.ok or not netplan.out.strip():
        problems.append("netplan is not installed (needed for the fabric config): "
                        "`sudo apt-get install netplan.io`")
    python = facts.python or (0, 0, 0)
    if python[:2] < MIN_PYTHON:
        problems.append(f"python3 {'.'.join(map(str, python))} is too old: sparkctl's node-side "
                        f"scripts need {'.'.join(map(str, MIN_PYTHON))} or newer")
    space = facts.disk.get(DOCKER_DIR) or DiskEntry()
    free = space.free_bytes or 0
    if space.error is not None:
        problems.append(f"cannot check free disk space for {DOCKER_DIR}: {space.error}")
    elif free < MIN_FREE_BYTES:
        problems.append(f"only {free / 1e9:.1f} GB free on {space.checked} "
                        f"(for {DOCKER_DIR}); the image and models need at least "
                        f"{MIN_FREE_BYTES / 1e9:.0f} GB")
    else:
        notes.append(f"{free / 1e9:.0f} GB free")
    from orchestrator.core.disks import space_problems

    problems += space_problems(facts)  # where sparkctl itself writes: state, config, netplan
    node_time = facts.time
    if isinstance(node_time, int | float) and abs(node_time - now) > MAX_CLOCK_SKEW_SECONDS:
        notes.append(f"WARNING: clock is {node_time - now:+.0f}s off the controller's (image pulls "
                     "fail with 'Root CA' errors on skewed clocks; enable NTP)")
    return problems, notes


def preflight_problems(inventory: Inventory, node: Node, facts: NodeFacts,
                       now: float | None = None) -> tuple[list[str], list[str]]:
    """(problems, notes) of one node; pure over its facts."""
    problems: list[str] = []
    notes: list[str] = []
    for found, said in (
        check_docker(inventory, facts),
        (check_fabric(inventory, facts), []),
        check_management(inventory, node, facts),
        check_system(facts, time.time() if now is None else now),
    ):
        problems += found
        notes += said
    if inventory.fabric.network == "adopted":  # other files ARE the network: they must hold it
        problems += adopted_problems(inventory, node, facts)
    else:
        problems += conflict_problems(inventory, node, facts)
    ring = ring_nccl_warning(inventory, facts)
    if ring:
        notes.append(ring)
    return problems, notes


class PreflightChecks(Step):
    """All of a node's read-only checks; fails listing every problem found."""

    name = "checks"

    def check(self, ctx: NodeContext) -> Outcome:
        problems, notes = preflight_problems(ctx.inventory, ctx.node, ctx.facts)
        if problems:
            listed = "\n".join(f"  - {p}" for p in problems)
            raise SparkctlError(
                f"{ctx.node.name}: preflight found {len(problems)} problem(s); nothing was changed:\n"
                f"{listed}"
            )
        return Unchanged("ready: " + ", ".join(notes))

    def apply(self, ctx: NodeContext, change: Any) -> str | None:  # never called: check never changes
        return None
