"""The inventory a lab writes: sparkctl reads it as-is (see docs/inventory.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sparklab.identity import MGMT_INTERFACE, LabIdentity
from sparklab.topology import LabPlan

CONTAINER_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13"
CONTAINER_NAME = "trtllm-multinode"
CONTAINER_SSH_PORT = 2233


def inventory_data(ident: LabIdentity, plan: LabPlan, key: Path, known_hosts: Path,
                   jump_host: bool = False) -> dict[str, Any]:
    address = ident.inner_address if jump_host else ident.mgmt_address
    data: dict[str, Any] = {
        "cluster": {
            "name": f"sparklab{ident.lab_id}-{plan.topology}",
            "user": "nvidia",
            "ssh_key": str(key),
            "known_hosts": str(known_hosts),
            "ssh_port": 22,
            "management_interface": MGMT_INTERFACE,
        },
        # veth links move a few Gb/s, not a Spark's 200G: the lab judges links by its own
        # thresholds, so `netcheck --deep` passes on a healthy lab and fails on a delayed one.
        "fabric": {"interfaces": list(plan.fabric_interfaces), "mtu": 9000,
                   "topology": plan.topology if len(plan.nodes) != 2 else "b2b",
                   "min_link_gbps": 0.5, "max_latency_ms": 5},
        # every engine; TensorRT-LLM's container is the one `up` runs on every node
        "engines": {"trtllm": {"container": {"image": CONTAINER_IMAGE, "name": CONTAINER_NAME,
                                             "ssh_port": CONTAINER_SSH_PORT}},
                    "vllm": {}, "sglang": {}, "llamacpp": {}},
        "nodes": [
            {"name": n.name, "host": address(n.index), "addresses": dict(n.addresses)}
            for n in plan.nodes
        ],
    }
    if jump_host:
        data["cluster"]["proxy_jump"] = f"nvidia@{ident.jump_address}"
    return data


def write_inventory(data: dict[str, Any], paths: list[Path]) -> None:
    text = ("# written by `sparkctl lab up` (simulated DGX Spark lab); thresholds are the lab's own\n"
            + yaml.safe_dump(data, sort_keys=False, default_flow_style=None))
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
