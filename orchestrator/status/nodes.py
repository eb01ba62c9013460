"""One node judged on its own for `sparkctl status` (pure, over its facts): its state (up,
network-only, not-set-up, problem), its fabric links (up, their addresses and MTU, as the
inventory wants them) and `up`'s container on it (running, the configuration and image `up`
would give it now). What needs every node (one image everywhere, half a cluster set up, the
server) is status/assess.py's.
"""

from __future__ import annotations

from typing import Any

from orchestrator.engines import up_container
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import NETPLAN_FILE
from orchestrator.remote.fact_records import CommandResult
from orchestrator.remote.gathered import NodeFacts
from orchestrator.timestamps import age


def role(inventory: Inventory, node: Node) -> str:
    return "head" if node.name == inventory.head_name else "worker"


def assess_node(inventory: Inventory, node: Node, facts: NodeFacts) -> dict[str, Any]:
    from orchestrator.core.disks import space_problems
    from orchestrator.phases.boot_units import parse_units

    problems: list[str] = []
    network = assess_network(inventory, node, facts, problems)
    container = assess_container(inventory, node, facts, problems)
    space = space_problems(facts)
    problems.extend(f"{p}: free some space on the node" if "full" in p else p for p in space)
    managed = facts.command("managed") or CommandResult(0, "", "")
    if container["status"] == "absent" and (space or managed.rc != 0):
        # "none" only when we could look: a full disk hides docker's state, a failing docker
        # answers nothing
        why = "; ".join(space) or f"`docker ps` exited {managed.rc}: " + managed.err.strip()[-200:]
        container.update(status="unknown", why=why)
    if problems:
        state = "problem"
    elif container["status"] == "running" or (container["name"] is None and network["configured"]):
        state = "up"  # (an inventory whose engines keep no `up` container: the network is all)
    elif network["configured"]:
        state = "network-only"
    else:
        state = "not-set-up"
    return {
        "name": node.name, "host": node.host, "role": role(inventory, node), "reachable": True,
        "state": state, "problems": problems, "network": network, "container": container,
        "boot_units": parse_units(facts.command("boot_units")),
    }


def assess_network(inventory: Inventory, node: Node, facts: NodeFacts, problems: list[str]) -> dict[str, Any]:
    ours = facts.exists(NETPLAN_FILE)
    configured = ours or inventory.fabric.network == "adopted"  # (files not ours hold it)
    links = facts.links.links if facts.links else {}
    devices = facts.roce.ports
    interfaces: dict[str, Any] = {}
    for iface in inventory.fabric.interfaces:
        link = links.get(iface)
        expected = (node.addresses or {}).get(iface)
        if link is None:
            entry: dict[str, Any] = {"state": "missing", "addresses": [], "mtu": None,
                                     "expected": expected, "ok": False}
            if configured:
                problems.append(f"fabric interface {iface} does not exist")
        else:
            port = devices.get(iface)
            state = (port.state if port else None) or link.operstate
            up = state.lower() == "up" or link.operstate == "UP"
            has_address = expected is None or expected in link.addresses
            mtu_ok = link.mtu == inventory.fabric.mtu
            entry = {"state": state, "device": port.device if port else None,
                     "addresses": list(link.addresses), "mtu": link.mtu,
                     "expected": expected, "ok": up and has_address and mtu_ok}
            if configured and not up:
                problems.append(f"fabric link {iface} is {state} (cable in, peer powered on?)")
            if configured and not has_address:
                problems.append(f"{iface} lacks its address {expected} (run `sparkctl up`)")
            if configured and has_address and not mtu_ok:
                problems.append(f"{iface} MTU is {link.mtu}, want {inventory.fabric.mtu}")
        interfaces[iface] = entry
    return {"configured": configured, "interfaces": interfaces}


def assess_container(inventory: Inventory, node: Node, facts: NodeFacts,
                     problems: list[str]) -> dict[str, Any]:
    if (up := up_container(inventory)) is None:
        return {"name": None, "status": "absent", "digest": None}
    name = up.settings.name
    failed = facts.inspect_error("containers", name)
    info = facts.container(name, strict=False)
    image = facts.image(up.settings.image, strict=False)
    digests = image.repo_digests if image else ()
    out: dict[str, Any] = {"name": name, "status": "absent",
                           "digest": digests[0].split("@", 1)[-1] if digests else None}
    if failed is not None:
        problems.append(f"docker inspect {name} failed: {failed}")
        out["status"] = "unknown"
        return out
    if info is None:
        return out
    labels = info.labels
    if not info.managed_by(inventory.cluster.name):
        out["status"] = "foreign"
        problems.append(f"container {name} was not created by sparkctl for this cluster")
        return out
    out.update({
        "status": info.status or ("running" if info.running else "exited"),
        "image": info.image,
        "image_id": info.image_id,
        "started": info.started_at if info.started_at != "?" else None,
        "uptime_seconds": age(info.started_at, facts.time) if info.running else None,
        "config_hash": labels.get("sparkctl.config-hash"),
    })
    if image and image.id and info.image_id and image.id != info.image_id:
        out["image_current"] = False
    desired = desired_config_hash(up, inventory, node, facts)
    out["config"] = "unknown" if desired is None else (
        "current" if desired == labels.get("sparkctl.config-hash") else "stale")
    if not info.running:
        problems.append(f"container {name} is {out['status']} (exit code {info.exit_code}; "
                        f"`sparkctl logs --node {node.name}` shows why; `sparkctl up` restarts it)")
    elif out["config"] == "stale" or out.get("image_current") is False:
        problems.append(f"container {name} runs an old configuration or image (run `sparkctl up`)")
    return out


def desired_config_hash(up: Any, inventory: Inventory, node: Node, facts: NodeFacts) -> str | None:
    """The hash `up` would label its container (UpContainer `up`) with now, or None."""
    from orchestrator.core.step import NodeContext, RunOptions, RunState
    from orchestrator.phases.container import Container

    ctx = NodeContext(inventory=inventory, node=node, facts=facts, cluster_facts={}, transport=None,
                      options=RunOptions(command="status"), shared=RunState())
    try:
        return Container(up.spec_for).wanted(ctx)[1]
    except Exception:  # facts the container step cannot use (no ibdev2netdev...): unknown, not a crash
        return None
