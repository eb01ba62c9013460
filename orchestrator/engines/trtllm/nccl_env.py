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
