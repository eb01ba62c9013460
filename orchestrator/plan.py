"""The plans of each command, assembled from phases (pure: no I/O)."""

from __future__ import annotations

from orchestrator.inventory import Inventory
from orchestrator.step import Plan


def build_up_plan(inventory: Inventory) -> Plan:
    """preflight -> network -> ssh keys -> trust files -> container -> mpi."""
    from orchestrator.steps import container, mpi, network, preflight, ssh_keys

    phases = [
        preflight.phase(inventory),
        network.phase(inventory),
        *ssh_keys.phases(inventory),
        container.phase(inventory),
        mpi.phase(inventory),
    ]
    return Plan("up", phases)
