"""Faked inventories, facts and transports for the unit tests of up's ssh/container/mpi phases."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from orchestrator.core.step import NodeContext, RunOptions
from orchestrator.inventory import Inventory
from orchestrator.inventory_checks import inventory_from_data
from orchestrator.remote.transport import Result

GOLDEN = Path(__file__).parent / "golden" / "up"
HOST_KEYS = {
    "spark-a": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfSparkA0000000000000000000000000000",
    "spark-b": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfSparkB0000000000000000000000000000",
}
CLUSTER_PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIClusterKey000000000000000000000000000000000"
IBDEV = {
    "enp1s0f1np1": {"device": "rocep1s0f1", "state": "Up"},
    "enP2p1s0f1np1": {"device": "roceP2p1s0f1", "state": "Up"},
}


def inventory(**container: Any) -> Inventory:
    data: dict[str, Any] = {
        "cluster": {"name": "two-sparks", "ssh_key": "/k"},
        "nodes": [
            {"name": "spark-a", "host": "a",
             "addresses": {"enp1s0f1np1": "192.168.200.12/24", "enP2p1s0f1np1": "192.168.201.12/24"}},
            {"name": "spark-b", "host": "b",
             "addresses": {"enp1s0f1np1": "192.168.200.13/24", "enP2p1s0f1np1": "192.168.201.13/24"}},
        ],
    }
    if container:
        data["container"] = container
    return inventory_from_data(data, "two-sparks.yml")


class FakeTransport:
    """Records commands (with their stdin) and answers from a queue of canned results."""

    def __init__(self, node: str, answers: list[tuple[int, str, str]] | None = None) -> None:
        self.node = node
        self.answers = list(answers or [])
        self.calls: list[dict[str, Any]] = []

    def run(self, command: str, *, stdin: Any = None, sudo: bool = False, timeout: Any = None,
            display: Any = None) -> Result:
        self.calls.append({"command": command, "stdin": stdin, "sudo": sudo, "display": display})
        status, out, err = self.answers.pop(0) if self.answers else (0, "", "")
        return Result(self.node, display or command, status, out, err, 0.0)

    def close(self) -> None:
        pass


def context(inv: Inventory, node: str, cluster_facts: dict[str, dict[str, Any]],
            shared: dict[str, Any] | None = None, transports: dict[str, FakeTransport] | None = None,
            options: RunOptions | None = None) -> NodeContext:
    transports = transports or {}
    return NodeContext(
        inventory=inv, node=inv.node(node), facts=cluster_facts[node], cluster_facts=cluster_facts,
        transport=transports.get(node), options=options or RunOptions(),
        shared={} if shared is None else shared, transports=transports,  # type: ignore[arg-type]
    )


def golden(name: str, actual: str) -> None:
    """Compare with tests/unit/golden/up/NAME; SPARKCTL_UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    if os.environ.get("SPARKCTL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert path.exists(), f"golden file missing: {path} (run with SPARKCTL_UPDATE_GOLDEN=1)"
    assert actual == path.read_text(), f"{name} differs from its golden file"
