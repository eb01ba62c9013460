"""NCCL's (and UCX's) environment in the container, derived from the inventory.

Which interfaces carry NCCL's bootstrap and which RoCE devices it uses come from the inventory
and the node's ibdev2netdev. A three-node ring needs more: NVIDIA's cluster setup script
(spark_cluster_setup.py) sets `NCCL_IB_MERGE_NICS=0` (each twin its own NIC: in a ring they
lead to different peers), `NCCL_NET_PLUGIN=none` (the IB verbs transport, not a plugin that
assumes one flat network) and `NCCL_IB_SUBNET_AWARE_ROUTING=1` (pick the NIC whose subnet holds
the peer: every ring link is its own subnet), and builds a ring-aware NCCL for it.
"""

from __future__ import annotations

import re

from orchestrator.inventory import Inventory
from orchestrator.remote.gathered import NodeFacts

RING_ENV = {
    "NCCL_IB_MERGE_NICS": "0",
    "NCCL_NET_PLUGIN": "none",
    "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
}
# NCCL added three-node ring support (subnet-aware routing across a switchless ring) in 2.30;
# NVIDIA's ring setup builds NCCL from source for it.
RING_MIN_NCCL = (2, 30)
DEFAULT_MIN_BUSBW = {"ring": 10.0}  # GB/s, NVIDIA's all_gather pass marks
DIRECT_MIN_BUSBW = 21.875  # GB/s = 175 Gb/s, direct cable or switch


def nccl_environment(inventory: Inventory, roce_devices: list[str]) -> dict[str, str]:
    interfaces = ",".join(inventory.fabric.interfaces)
    env = {
        "UCX_NET_DEVICES": interfaces,
        "NCCL_SOCKET_IFNAME": interfaces,
        "NCCL_IB_HCA": ",".join(roce_devices),
    }
    if inventory.topology == "ring":
        env.update(RING_ENV)
    return env


def fabric_variable_names(inventory: Inventory) -> list[str]:
    """The names of every NCCL/UCX variable the containers carry for this inventory (the ring's
    three included), in a stable order: what mpirun must forward (-x) to remote ranks, whose
    sessions come through the container's sshd with none of the container's environment."""
    env = nccl_environment(inventory, [])
    first = [name for name in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "UCX_NET_DEVICES") if name in env]
    return first + sorted(name for name in env if name not in first)


def min_nccl_busbw(inventory: Inventory) -> float:
    configured = inventory.fabric.min_nccl_busbw_gbps
    if configured is not None:
        return configured
    return DEFAULT_MIN_BUSBW.get(inventory.topology, DIRECT_MIN_BUSBW)


def parse_nccl_version(text: str) -> tuple[int, int, int] | None:
    """`2.27.7` / `NCCL version 2.27.7+cuda13.0` / a libnccl.so.2.27.7 file name."""
    match = re.search(r"(?:NCCL[ _]version\s*|libnccl\.so\.|nccl-?)(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        match = re.search(r"\b(\d+)\.(\d+)\.(\d+)\b", text)
    return tuple(int(x) for x in match.groups()) if match else None  # type: ignore[return-value]


def ring_capable(version: tuple[int, int, int] | None) -> bool | None:
    """True/False from the NCCL version; None when it could not be read."""
    if version is None:
        return None
    return version[:2] >= RING_MIN_NCCL


# ---------------------------------------------------------------- ring capability (preflight)
NCCL_FACT = "image_nccl"
_NCCL_PROBE = (
    "ls -1 /usr/lib/*-linux-gnu/libnccl.so.* /usr/local/lib/libnccl.so.* "
    "/usr/local/nccl/lib/libnccl.so.* 2>/dev/null; "
    "ls -1d /usr/local/lib/python3*/dist-packages/nvidia_nccl* "
    "/usr/lib/python3*/dist-packages/nvidia_nccl* 2>/dev/null; true"
)


def ring_nccl_fact(image: str) -> dict[str, str]:
    """Facts `commands` entry (ring only): the NCCL library files of the image, when it is on
    the node (never pulls in preflight)."""
    from orchestrator.commands import docker_cmd, quote

    probe = docker_cmd("run", "--rm", "--network", "none", image, "sh", "-c", _NCCL_PROBE)
    inspect = docker_cmd("image", "inspect", image)
    return {NCCL_FACT: f"if {inspect} >/dev/null 2>&1; then {probe}; else echo {quote('not-pulled')}; fi"}


def ring_nccl_warning(inventory: Inventory, facts: NodeFacts) -> str | None:
    """A preflight note for a ring whose image's NCCL is not (known to be) ring-capable."""
    if inventory.topology != "ring":
        return None
    out = facts.output(NCCL_FACT).strip()
    if out == "not-pulled":
        return None  # known after the pull; the next `up` or `netcheck --deep` tells
    found = [parse_nccl_version(line) for line in out.splitlines()]
    versions = sorted(v for v in found if v)
    fix = ("Fix: use an image with NCCL >= 2.30 (three-node ring support), or build NCCL from "
           "source as NVIDIA's ring setup does and mount it into the container")
    if not versions:
        return (f"WARNING: ring: could not tell the NCCL version of {inventory.container.image} "
                f"(found {out.splitlines()[0] if out else 'no libnccl.so.X.Y.Z'}); a ring needs a "
                f"ring-aware NCCL (>= 2.30). {fix}")
    version = versions[-1]
    if ring_capable(version):
        return None
    return (f"WARNING: ring: {inventory.container.image} ships NCCL {'.'.join(map(str, version))}, "
            f"which is not ring-capable (< 2.30): NCCL cannot route a three-node ring. {fix}")


def bootstrap_interfaces(inventory: Inventory, ranks: list[str]) -> list[str] | None:
    """Per rank (node names in rank order), the one interface NCCL's socket bootstrap must use in
    a ring; None elsewhere (every fabric interface reaches every peer there).

    NCCL's bootstrap listens on a single interface per rank, the first of NCCL_SOCKET_IFNAME's
    matches, and rank 0 connects back to each rank's listening address. In a ring every link is
    its own subnet, so the full list makes a rank listen on its link to another neighbour, which
    rank 0 cannot reach: each rank must use its interface on the link it shares with rank 0
    (rank 0: with rank 1). Ranks that are not rank 0's neighbours cannot be bootstrapped over the
    fabric at all; they keep the first interface and NCCL fails, as it would on real Sparks."""
    import ipaddress

    if inventory.topology != "ring" or len(ranks) < 2:
        return None
    chosen = []
    for index, name in enumerate(ranks):
        node, peer = inventory.node(name), inventory.node(ranks[1 if index == 0 else 0])
        peer_ips = [ipaddress.IPv4Interface(c).ip for c in (peer.addresses or {}).values()]
        shared = [i for i in inventory.fabric.interfaces
                  if any(ip in ipaddress.IPv4Interface((node.addresses or {})[i]).network
                         for ip in peer_ips)]
        chosen.append((shared or inventory.fabric.interfaces)[0])
    return chosen
