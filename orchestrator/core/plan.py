"""The plans of each command, assembled from phases in one place (pure: no I/O)."""

from __future__ import annotations

from orchestrator.core.step import Plan
from orchestrator.inventory import Inventory

UP_ENGINES = ("trtllm",)
"""Engines whose node set-up `up` does (TensorRT-LLM's container with its sshd, and MPI)."""


def build_up_plan(inventory: Inventory, oom_guard: bool = False) -> Plan:
    """preflight -> network (-> fabric-mtu on a switch) -> ssh keys -> trust files -> engines
    (-> oom-guard: earlyoom behind the memory guard, with --oom-guard)."""
    from orchestrator.engines import get_engine
    from orchestrator.phases import mtu_path, network, oomguard, preflight, ssh_keys

    phases = [preflight.phase(inventory), network.phase(inventory)]
    if inventory.topology == "switch":  # switch ports must carry the fabric MTU end to end
        phases.append(mtu_path.phase(inventory))
    phases += ssh_keys.phases(inventory)
    for name in UP_ENGINES:
        phases += get_engine(name).up_phases(inventory)
    if oom_guard:
        phases.append(oomguard.phase(inventory))
    return Plan("up", phases)
