"""llama.cpp's part of `launch --persist` (the shared mechanism: phases/persist.py).

Every container (rpc-server on the other nodes, llama-server on the first) runs with a restart
policy, so docker starts them again at boot; each rpc node's boot unit waits for its
rpc-server's container, the first node's for /health 200 (llama-server connects to the
rpc-servers when it starts: one that comes up later makes it exit, and the unit starts it again).
"""

from __future__ import annotations

from orchestrator.core.step import Phase
from orchestrator.engines.base import LaunchOptions
from orchestrator.engines.llamacpp.serve import ServeSpec
from orchestrator.inventory import Node
from orchestrator.phases import persist
from orchestrator.phases.memory import guard_threshold


def persist_phase(spec: ServeSpec, options: LaunchOptions) -> Phase:
    container = spec.container
    nodes = list(spec.nodes)
    e = spec.estimate

    def part(node: Node) -> persist.Part:
        if node.name == nodes[0]:
            return persist.Part(containers=[container], health_port=spec.recipe.port)
        return persist.Part(containers=[container], ready=[
            (f"rpc-server in {container} running", persist.running_cmd(container))])

    return persist.phase(persist.PersistSpec(
        server=spec.name, engine="llamacpp", recipe=spec.recipe, inventory=spec.inventory,
        nodes=nodes, part=part, guard_gb=guard_threshold(options.guard_min_available_gb, spec.recipe),
        loaded_gb=e.weights_gb + e.draft_gb + e.runtime_gb, deadline=options.timeout))
