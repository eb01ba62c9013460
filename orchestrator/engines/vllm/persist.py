"""vLLM's part of `launch --persist` (the shared mechanism: phases/persist.py).

The containers run with a restart policy. With Ray docker brings back the head's `ray start
--head` and every worker's `ray start --address` (a worker that could not reach the head yet is
started again by its node's boot unit); the head's unit waits until Ray lists every serving node
(head last), then runs the same `vllm serve` launch ran, records it, and waits for /health.
Without Ray (mp) the other nodes' containers are their headless ranks, which wait for rank 0 by
themselves; the head's unit starts rank 0 at once.
"""

from __future__ import annotations

from orchestrator.commands import join
from orchestrator.core.step import Phase
from orchestrator.engines import one_server_engines
from orchestrator.engines.base import LaunchOptions
from orchestrator.engines.serverctl import node_cmd
from orchestrator.engines.vllm.ray import node_ip, probe_cmd
from orchestrator.engines.vllm.serve import MAIN, OURS, ServeSpec, start_cmd
from orchestrator.inventory import Node
from orchestrator.node.boot import BOOT_TIME
from orchestrator.phases import persist
from orchestrator.phases.memory import guard_threshold

# reads the Ray probe's JSON on stdin: exit 0 when every wanted IP is alive
EVERY_NODE = ("import json,sys\n"
              "lines=[l for l in sys.stdin.read().splitlines() if l.startswith('{')]\n"
              "nodes=json.loads(lines[-1]).get('nodes') or [] if lines else []\n"
              "alive={n.get('ip') for n in nodes if n.get('alive')}\n"
              "sys.exit(0 if set(sys.argv[1:]) <= alive else 1)\n")


def persist_phase(spec: ServeSpec, options: LaunchOptions) -> Phase:
    recipe, inventory = spec.recipe, spec.inventory
    container = recipe.container_name
    nodes = list(spec.serving)
    estimate = recipe_estimate(spec)

    ray = recipe.backend == "ray"

    def part(node: Node) -> persist.Part:
        if node.name != nodes[0]:
            # mp: the container is the headless rank; it waits for rank 0 by itself
            role = "Ray worker" if ray else "headless vLLM rank"
            return persist.Part(containers=[container], ready=[
                (f"{role} {container} running", persist.running_cmd(container))])
        ips = [node_ip(inventory, inventory.node(name)) for name in nodes]
        every = f"{probe_cmd(container)} 2>/dev/null | {join(['python3', '-c', EVERY_NODE, *ips])}"
        record = {**spec.record(), "started": BOOT_TIME}
        return persist.Part(
            containers=[container],
            wait=[(f"Ray lists every serving node ({', '.join(ips)})", every)] if ray else [],
            start=[(f"vllm serve {recipe.model} in {container}",
                    start_cmd(container, spec.argv, spec.key_file)),
                   ("the server record", node_cmd(container, action="started", server=record,
                                                  main=MAIN, ours=OURS))],
            # a worker that rebooted alone rejoins Ray; the stalled vllm serve must go first
            restart=[("stop the stalled vllm serve", node_cmd(container, action="stop",
                                                               rotate=True, ours=OURS))],
            health_port=recipe.port)

    return persist.phase(persist.PersistSpec(
        server=options.name or recipe.name, engine="vllm", recipe=recipe, inventory=inventory,
        nodes=nodes, part=part, guard_gb=guard_threshold(options.guard_min_available_gb, recipe),
        loaded_gb=estimate, deadline=options.timeout, one_per_cluster=one_server_engines()))


def recipe_estimate(spec: ServeSpec) -> float:
    from orchestrator.engines.vllm.recipe import estimate_memory

    e = estimate_memory(spec.recipe)
    return e.weights_gb + e.draft_gb + e.runtime_gb
