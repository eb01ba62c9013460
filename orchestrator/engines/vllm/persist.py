"""vLLM's part of `launch --persist` (the shared mechanism: phases/persist.py), per server.

The server's containers run with a restart policy. With Ray every node's unit first puts back
the port guard (engines/vllm/guard.py; iptables rules do not survive a reboot), stopping the
container when it cannot. Docker brings back the first node's
`ray start --head` and every worker's `ray start --address` (a worker that could not reach the
head yet is started again by its node's boot unit); the first node's unit waits until Ray lists
every node of the server (itself last), then runs the same `vllm serve` launch ran, records it,
and waits for /health. Without Ray (mp) the other nodes' containers are their headless ranks,
which wait for rank 0 by themselves; the first node's unit starts rank 0 at once, and its
watcher judges every rank: rank 0 answers /health 200 after a rank died (the real vLLM), so it
follows the connections rank 0's processes hold to each other node (node/rank_links.py) and
restarts rank 0 when a rank that died comes back (its node rebooted: docker restarted its
container, whose headless rank cannot join the running rank 0).
"""

from __future__ import annotations

import json

from orchestrator.commands import join
from orchestrator.core.step import Phase
from orchestrator.engines import servers
from orchestrator.engines.serverctl import node_cmd
from orchestrator.engines.vllm.guard import chain_name, guard_config
from orchestrator.engines.vllm.ray import probe_cmd
from orchestrator.engines.vllm.serve import MAIN, OURS, ServeSpec, start_cmd
from orchestrator.inventory import Node
from orchestrator.node import script
from orchestrator.node.boot import BOOT_TIME
from orchestrator.phases import persist
from orchestrator.phases.port_guards import guard_cmd
from orchestrator.recipe import LaunchOptions
from orchestrator.remote.container import ContainerCommands

# reads the Ray probe's JSON on stdin: exit 0 when every wanted IP is alive
EVERY_NODE = script("ray_every.py")
"""Whether every serving node is alive in Ray, from RAY_PROBE's answer (node/ray_every.py)."""
RANK_LINKS = script("rank_links.py")


def ranks_cmd(spec: ServeSpec) -> str:
    """In the first node's container: the connections `vllm serve`'s processes hold to each
    other node's rank (its fabric address: the rank's VLLM_HOST_IP)."""
    peers = {name: spec.node_ip(name) for name in spec.nodes[1:]}
    args = json.dumps({"pid_file": f"{spec.directory}/{MAIN}", "peers": peers}, sort_keys=True)
    return ContainerCommands(spec.container).exec_cmd(["python3", "-c", RANK_LINKS, args])


def persist_phase(spec: ServeSpec, options: LaunchOptions) -> Phase:
    recipe, container = spec.recipe, spec.container
    nodes = list(spec.nodes)
    ray = spec.backend == "ray"

    def part(node: Node) -> persist.Part:
        # after a reboot the firewall is empty: the port guard again before Ray may serve, and
        # without it (iptables gone) the container stops rather than run open; built when the
        # boot plan is (its worker range is the placement step's pick: engines/vllm/check.py)
        first = [(f"Ray's port guard ({chain_name(spec.name)}: Ray's ports on lo and the "
                  "fabric only)", f"{guard_cmd('install', guard_config(spec))} >/dev/null || "
                  f"{{ {join(['docker', 'stop', container])}; exit 1; }}")] if ray else []
        if node.name != nodes[0]:
            # mp: the container is the headless rank; it waits for rank 0 by itself
            role = "Ray worker" if ray else "headless vLLM rank"
            return persist.Part(containers=[container], first=first, ready=[
                (f"{role} {container} running", persist.running_cmd(container))])
        ips = [spec.node_ip(name) for name in nodes]
        every = f"{probe_cmd(container)} 2>/dev/null | {join(['python3', '-c', EVERY_NODE, *ips])}"
        return persist.Part(
            containers=[container], first=first,
            wait=[(f"Ray lists every node of {spec.name} ({', '.join(ips)})", every)] if ray else [],
            start=[(f"vllm serve {recipe.model} in {container}",
                    start_cmd(container, spec.directory, spec.argv, spec.key_file)),
                   ("vllm serve's pid", node_cmd(container, action="started", server=spec.record(),
                                                 main=MAIN, ours=OURS, run=spec.directory)),
                   ("the server record", servers.record_cmd(spec.name, spec.record(BOOT_TIME)))],
            # a worker that rebooted alone rejoins Ray; the stalled vllm serve must go first
            restart=[("stop the stalled vllm serve", spec.stop_cmd())],
            ranks=ranks_cmd(spec) if not ray and len(nodes) > 1 else None,
            health_port=recipe.port)

    e = spec.estimate
    return persist.phase(persist.PersistSpec(
        server=spec.name, engine="vllm", recipe=recipe, inventory=spec.inventory,
        nodes=nodes, part=part, guard_gb=spec.guard_gb,
        loaded_gb=e.weights_gb + e.draft_gb + e.runtime_gb, deadline=options.timeout))
