"""TensorRT-LLM's part of `launch --persist` (the shared mechanism: phases/persist.py).

The `up` container (its sshd: MPI's way in) runs with a restart policy, so docker brings it back
on every node. Then each node's boot unit starts the memory guard as launch did; the head waits
until every peer's container sshd answers on its fabric address (head last), then runs the same
`mpirun ... trtllm-serve` launch ran and records the server, and waits for /health.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.step import Phase
from orchestrator.engines import one_server_engines
from orchestrator.engines.base import LaunchOptions
from orchestrator.engines.serverctl import node_cmd
from orchestrator.engines.trtllm.serve import LaunchSpec, node_plan, start_cmd
from orchestrator.inventory import Node
from orchestrator.node.boot import BOOT_TIME  # the boot script's start time goes there
from orchestrator.phases import persist
from orchestrator.phases.memory import guard_cmd


def persist_phase(spec: LaunchSpec, options: LaunchOptions) -> Phase:
    recipe, inventory = spec.recipe, spec.inventory
    container = inventory.container.name
    nodes = [n.name for n in inventory.ordered_nodes() if n.name in spec.serving]
    port = inventory.container.ssh_port
    guard = spec.guard_min_available_gb

    def part(node: Node) -> persist.Part:
        start = [("memory guard", guard_cmd(container, node.name, guard))]
        if node.name != nodes[0]:
            address = inventory.mpi_address(node)
            return persist.Part(containers=[container], start=start, ready=[
                (f"sshd in {container} on {address}:{port}", persist.tcp_cmd(address, port))])
        record: dict[str, Any] = {**spec.record(),
                                  "started": BOOT_TIME}
        peers = [inventory.node(name) for name in nodes[1:]]
        wait = [(f"sshd in {container} on {peer.name} ({inventory.mpi_address(peer)}:{port})",
                 persist.tcp_cmd(inventory.mpi_address(peer), port)) for peer in peers]
        start += [(f"mpirun ... trtllm-serve {recipe.model} in {container}",
                   start_cmd(container, spec.argv, spec.relay)),
                  ("the server record", node_cmd(container, action="started", server=record))]
        # a rank's node that rebooted alone: mpirun (and the memory guard) go, then start again
        stop = [("stop the stalled mpirun", node_cmd(container, action="stop", rotate=True))]
        return persist.Part(containers=[container], wait=wait, start=start,
                            health_port=recipe.port, restart=stop)

    return persist.phase(persist.PersistSpec(
        server=options.name or recipe.name, engine="trtllm", recipe=recipe, inventory=inventory,
        nodes=nodes, part=part, guard_gb=guard, loaded_gb=node_plan(recipe).loaded_gb,
        deadline=options.timeout, one_per_cluster=one_server_engines()))
