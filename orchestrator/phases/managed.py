"""The containers sparkctl made for this cluster (labels sparkctl.managed and
sparkctl.cluster): how `docker ps` selects them and reads its answer. Shared by `down`
(phases/teardown.py), `status` and the servers' listing (engines/servers.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.commands import docker_cmd
from orchestrator.errors import SparkctlError
from orchestrator.remote.fact_records import CommandResult
from orchestrator.remote.gathered import NodeFacts

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory


def managed_filter_args(inventory: Inventory) -> list[str]:
    """docker filters selecting only the containers sparkctl made for this cluster."""
    return ["--filter", "label=sparkctl.managed=true",
            "--filter", f"label=sparkctl.cluster={inventory.cluster.name}"]


def managed_ps_cmd(inventory: Inventory, fmt: str = r"{{.ID}}\t{{.Names}}\t{{.State}}") -> str:
    """One line per managed container (default: full id, name, state)."""
    return docker_cmd("ps", "-a", "--no-trunc", *managed_filter_args(inventory), "--format", fmt)


@dataclass(frozen=True)
class ManagedContainer:
    id: str
    name: str
    state: str


def managed_containers(facts: NodeFacts) -> list[ManagedContainer]:
    answer = facts.command("managed") or CommandResult(0, "", "")
    if answer.rc != 0:
        raise SparkctlError(
            f"cannot list containers (`docker ps` exited {answer.rc}): "
            f"{answer.err.strip()[-300:]}; is docker running and the user in the docker group?"
        )
    out = []
    for line in answer.out.splitlines():
        parts = line.strip().split("\t")
        if len(parts) >= 2 and parts[0]:
            out.append(ManagedContainer(parts[0], parts[1], parts[2] if len(parts) > 2 else "?"))
    return out
