"""netcheck's container checks: what the container `up` keeps on every node (a served engine's:
engines.base.UpContainer) really runs with (from `docker inspect`).

The environment a running container has is what NCCL, UCX and Open MPI read, whatever the
inventory says now; a container started by hand, or before the inventory changed, shows here.
An inventory whose engines keep no container from `up` has none of these checks.
"""

from __future__ import annotations

from typing import Any

from orchestrator.engines import up_container
from orchestrator.inventory import Inventory, Node
from orchestrator.netcheck.results import CheckResult, Status, _link
from orchestrator.remote.fact_records import ContainerInfo
from orchestrator.remote.gathered import NodeFacts

INTERFACE_LISTS = ("NCCL_SOCKET_IFNAME", "UCX_NET_DEVICES", "OMPI_MCA_btl_tcp_if_include",
                   "OMPI_MCA_oob_tcp_if_include", "PRTE_MCA_prte_if_include")


def _container(inventory: Inventory, facts: NodeFacts) -> ContainerInfo | None:
    up = up_container(inventory)
    return facts.container(up.settings.name, strict=False) if up else None


def container_running(inventory: Inventory, facts: NodeFacts) -> bool:
    container = _container(inventory, facts)
    return bool(container and container.running)


def container_env(container: ContainerInfo | None) -> dict[str, str]:
    pairs = container.env if container else ()
    return dict(str(item).partition("=")[::2] for item in pairs)


def check_container_running(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    up = up_container(inventory)
    if up is None:
        return []
    name = up.settings.name
    failed = facts.inspect_error("containers", name)
    container = _container(inventory, facts)
    result = CheckResult("container", node.name, "pass", f"{name} is running.")
    if container is None:
        result.status = "fail"
        detail = failed if failed is not None else "no such container"
        result.message = f"container {name} on {node.name}: {detail}."
        result.fix = "run `sparkctl up` (it creates the container with the fabric settings)"
    elif not container.running:
        result.status, result.value = "fail", container.status
        result.message = (f"container {name} on {node.name} is {container.status} "
                          f"(exit code {container.exit_code}): its entrypoint failed or the SSH "
                          f"port {up.settings.ssh_port} is taken.")
        result.fix = f"`docker logs {name}` on {node.name}, then `sparkctl up`"
    return [result]


def _named_interfaces(value: str) -> list[str]:
    """NCCL's syntax: '=' means exact names, '^' excludes (nothing to check then)."""
    if value.startswith("^"):
        return []
    return [part.split(":")[0] for part in value.lstrip("=").split(",") if part]


def check_container_env(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    up = up_container(inventory)
    container = _container(inventory, facts)
    if container is None or up is None:
        return []
    env = container_env(container)
    out = []
    for key, want in up.expected_env(inventory, facts).items():
        have = env.get(key)
        result = CheckResult("container-env", node.name, "pass", f"{key}={have}.",
                             interface=None, value=have, threshold=want)
        down = []
        if key in INTERFACE_LISTS and have:
            down = [i for i in _named_interfaces(have)
                    if not ((link := _link(facts, i)) and link.up and link.carrier)]
        if down:
            result.status = "fail"
            result.interface = down[0]
            result.message = (f"{key}={have} in {up.settings.name} on {node.name} names "
                              f"{', '.join(down)}, which is missing or down: NCCL fails with "
                              "'Socket operation on non-socket', MPI hangs.")
            result.fix = ("recreate the container with the inventory's fabric interfaces "
                          "(`sparkctl up` replaces a stale container), and bring the fabric up")
        elif have != want:
            result.status = "fail"
            result.message = (f"{key} in {up.settings.name} on {node.name} is {have!r}, the "
                              f"inventory gives {want!r}: traffic may take the wrong interface.")
            result.fix = "`sparkctl up` recreates the container with the inventory's settings"
        out.append(result)
    out += _check_ib_hca(inventory, node, facts, env)
    return out


def _check_ib_hca(inventory: Inventory, node: Node, facts: NodeFacts,
                  env: dict[str, str]) -> list[CheckResult]:
    """NCCL ran at ~3 GB/s until NCCL_IB_HCA covered both twins (REFERENCE.md 4.1)."""
    devices = facts.roce.ports
    wanted = [devices[i].device for i in inventory.fabric.interfaces if i in devices]
    if not wanted:
        return []
    have = env.get("NCCL_IB_HCA", "")
    named = {part.split(":")[0] for part in have.lstrip("=^").split(",") if part}
    missing = [d for d in wanted if d not in named]
    result = CheckResult("container-env", node.name, "pass", f"NCCL_IB_HCA={have}.",
                         value=have or None, threshold=",".join(wanted))
    if missing:
        result.status = "warn"
        result.message = (f"NCCL_IB_HCA={have!r} on {node.name} leaves out {', '.join(missing)}: "
                          "NCCL then uses fewer RoCE devices (seen at ~3 GB/s instead of ~24 GB/s).")
        result.fix = "`sparkctl up` sets NCCL_IB_HCA to the RoCE devices of every fabric interface"
    return [result]


def check_engine_files(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    """The engine's own checks of what its container depends on (TensorRT-LLM: the hostfile)."""
    up = up_container(inventory)
    return [result for check in (up.node_checks if up else ()) for result in
            check(inventory, node, facts)]


def facts_request(inventory: Inventory, node: Node) -> dict[str, Any]:
    """What the container checks read: the container, its image, and what its engine adds."""
    from orchestrator.remote.facts import merge_requests

    up = up_container(inventory)
    if up is None:
        return {}
    return merge_requests([{"containers": [up.settings.name], "images": [up.settings.image]},
                           up.facts(inventory, node)])


CONTAINER_CHECKS = [check_container_running, check_container_env, check_engine_files]


def check_image_digests(inventory: Inventory, facts_by_node: dict[str, NodeFacts]) -> list[CheckResult]:
    """Every node must run the same image, byte for byte (tags drift between nodes)."""
    up = up_container(inventory)
    if up is None:
        return []
    images: dict[str, str] = {}
    for name, facts in facts_by_node.items():
        container = _container(inventory, facts)
        image_id: str | None = container.image_id if container else None
        if not image_id:
            local = facts.image(up.settings.image, strict=False)
            image_id = local.id if local else None
        if image_id:
            images[name] = str(image_id)
    distinct = sorted(set(images.values()))
    if len(distinct) <= 1:
        value = distinct[0][:19] if distinct else None
        return [CheckResult("image", name, "pass", f"same image on every node ({value}).",
                            value=value) for name in images]
    majority = max(distinct, key=lambda d: sum(1 for v in images.values() if v == d))
    listing = ", ".join(f"{n} -> {d[:19]}" for n, d in sorted(images.items()))
    has_majority = list(images.values()).count(majority) > len(images) / 2
    out = []
    for name, digest in images.items():
        status: Status = "pass" if has_majority and digest == majority else "fail"
        out.append(CheckResult(
            "image", name, status, f"the nodes run different images: {listing}.",
            value=digest[:19], threshold=majority[:19] if status == "fail" else None,
            fix="" if status == "pass" else (
                f"pull {up.settings.image} on every node, then `sparkctl up` "
                "(it refuses to start when digests differ)"),
        ))
    return out


CLUSTER_CHECKS = [check_image_digests]
