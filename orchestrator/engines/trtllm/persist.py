"""TensorRT-LLM's part of `launch --persist` (the shared mechanism: phases/persist.py).

The `up` container (its sshd: MPI's way in) runs with a restart policy, so docker brings it back
on every node. Then each of the server's nodes' boot unit starts the memory guard as launch did
(in the server's directory); its first node waits until every peer's container sshd answers on
its fabric address (first node last), then runs the same `mpirun ... trtllm-serve` launch ran
(the server's own hostfile, in RUN_DIR/servers/<name>/, which stays on disk), records the server
there and waits for /health. Several persistent servers each have their own unit.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.step import Phase
from orchestrator.engines.serverctl import node_cmd
from orchestrator.engines.trtllm.serve import MAIN, OURS, LaunchSpec, node_plan
from orchestrator.inventory import Node
from orchestrator.node.boot import BOOT_TIME  # the boot script's start time goes there
from orchestrator.phases import persist
from orchestrator.phases.memory import guard_cmd
from orchestrator.recipe import LaunchOptions


def persist_phase(spec: LaunchSpec, options: LaunchOptions) -> Phase:
    recipe, inventory = spec.recipe, spec.inventory
    container, directory = spec.container, spec.run_dir
    nodes = list(spec.nodes)  # rank order: mpirun runs on the first
    port = inventory.container.ssh_port
    guard = spec.guard_min_available_gb

    def part(node: Node) -> persist.Part:
        start = [("memory guard", guard_cmd(container, node.name, guard, directory))]
        if node.name != nodes[0]:
            address = inventory.mpi_address(node)
            return persist.Part(containers=[container], start=start, ready=[
                (f"sshd in {container} on {address}:{port}", persist.tcp_cmd(address, port))])
        record: dict[str, Any] = spec.record(started=BOOT_TIME)
        peers = [inventory.node(name) for name in nodes[1:]]
        wait = [(f"sshd in {container} on {peer.name} ({inventory.mpi_address(peer)}:{port})",
                 persist.tcp_cmd(inventory.mpi_address(peer), port)) for peer in peers]
        # mpirun.pid of before the reboot names nothing (or another process now): the record
        # takes the new one's pid
        start += [(f"mpirun ... trtllm-serve {recipe.model} in {container}",
                   f"rm -f {directory}/{MAIN} && {spec.start_cmd()}"),
                  ("the server record", node_cmd(container, action="started", server=record,
                                                 run=directory, main=MAIN))]
        # a rank's node that rebooted alone: mpirun (and the memory guard) go, then start again
        stop = [("stop the stalled mpirun", node_cmd(container, action="stop", rotate=True,
                                                     run=directory, ours=list(OURS)))]
        return persist.Part(containers=[container], wait=wait, start=start,
                            health_port=recipe.port, restart=stop)

    return persist.phase(persist.PersistSpec(
        server=spec.name, engine=recipe.engine, recipe=recipe, inventory=inventory,
        nodes=nodes, part=part, guard_gb=guard, loaded_gb=node_plan(recipe).loaded_gb,
        deadline=options.timeout))
