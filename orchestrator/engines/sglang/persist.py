"""SGLang's part of `launch --persist` (the shared mechanism: phases/persist.py).

Each rank's container is the server itself (`python3 -m sglang.launch_server`), run with a
restart policy: docker starts every rank again at boot and the ranks meet at the first node's
--dist-init-addr as they did at launch (torch.distributed waits for all of them, so the order
docker starts them in does not matter). Each node's boot unit checks the fabric, models and
memory, starts a rank docker did not restart, and the first node's waits for /health 200.
"""

from __future__ import annotations

from orchestrator.core.step import Phase
from orchestrator.engines import one_server_engines
from orchestrator.engines.base import LaunchOptions
from orchestrator.engines.sglang.serve import ServeSpec
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
            (f"SGLang rank {nodes.index(node.name)} in {container} running",
             persist.running_cmd(container))])

    return persist.phase(persist.PersistSpec(
        server=spec.name, engine="sglang", recipe=spec.recipe, inventory=spec.inventory,
        nodes=nodes, part=part, guard_gb=guard_threshold(options.guard_min_available_gb, spec.recipe),
        loaded_gb=e.weights_gb + e.draft_gb + e.runtime_gb, deadline=options.timeout,
        one_per_cluster=one_server_engines()))
