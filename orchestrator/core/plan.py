"""The plans of each command, assembled from phases in one place (pure: no I/O)."""

from __future__ import annotations

from orchestrator.core.step import Plan
from orchestrator.inventory import Inventory


def build_up_plan(inventory: Inventory, oom_guard: bool = False) -> Plan:
    """preflight -> network (-> fabric-mtu on a switch) -> ssh keys -> trust files -> engines
    (-> oom-guard: earlyoom behind the memory guard, with --oom-guard)."""
    from orchestrator.engines import DEFAULT_ENGINE, get_engine
    from orchestrator.phases import mtu_path, network, oomguard, preflight, ssh_keys

    phases = [preflight.phase(inventory), network.phase(inventory)]
    if inventory.topology == "switch":  # switch ports must carry the fabric MTU end to end
        phases.append(mtu_path.phase(inventory))
    phases += ssh_keys.phases(inventory)
    # the default engine's node set-up (its container with sshd, and MPI): the four-command flow
    phases += get_engine(DEFAULT_ENGINE).up_phases(inventory)
    if oom_guard:
        phases.append(oomguard.phase(inventory))
    return Plan("up", phases)
