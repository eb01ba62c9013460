"""The plans of each command, assembled from phases (pure: no I/O)."""

from __future__ import annotations

from orchestrator.core.step import Plan
from orchestrator.inventory import Inventory


def build_up_plan(inventory: Inventory) -> Plan:
    """preflight -> network -> ssh keys -> trust files -> container -> mpi."""
    from orchestrator.engines.trtllm import mpi
    from orchestrator.phases import container, network, preflight, ssh_keys

    phases = [
        preflight.phase(inventory),
        network.phase(inventory),
        *ssh_keys.phases(inventory),
        container.phase(inventory),
        mpi.phase(inventory),
    ]
    return Plan("up", phases)
