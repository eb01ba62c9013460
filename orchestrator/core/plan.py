"""The plans of each command, assembled from phases in one place (pure: no I/O)."""

from __future__ import annotations

from orchestrator.core.step import Plan
from orchestrator.inventory import Inventory


def build_up_plan(inventory: Inventory, oom_guard: bool = False) -> Plan:
    """preflight -> network (-> fabric-mtu on a switch) -> the served engines' own phases
    (TensorRT-LLM's: ssh keys, trust files and hostfile, its container, MPI) (-> oom-guard:
    earlyoom behind the memory guard, with --oom-guard)."""
    from orchestrator.engines import capabilities, get_engine
    from orchestrator.phases import adopted, mtu_path, network, oomguard, preflight

    # an adopted network (fabric.network: adopted) is verified, never written
    fabric = adopted if inventory.fabric.network == "adopted" else network
    phases = [preflight.phase(inventory), fabric.phase(inventory)]
    if inventory.topology == "switch":  # switch ports must carry the fabric MTU end to end
        phases.append(mtu_path.phase(inventory))
    # each served engine's node set-up (by default every engine, so TensorRT-LLM's container
    # with sshd and MPI: the four-command flow); an inventory naming others skips that image
    for name in inventory.served_engines:
        phases += capabilities.up_phases(get_engine(name), inventory)
    if oom_guard:
        phases.append(oomguard.phase(inventory))
    return Plan("up", phases)
