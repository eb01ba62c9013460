"""The recorded server's own containers in `sparkctl status`, judged from docker's facts.

Why: vLLM's server lives in one Ray container per serving node (its record's `container`). When
a worker's container or raylet dies, docker knows at once, but Ray keeps calling the node alive
until its health checks give up (~25 s), and status used to repeat Ray: "ray: 2/2 node(s)
alive", the worker "up". The container's exit is a fact of the same round trip: it wins.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.paths import SERVER_JSON
from orchestrator.remote.gathered import NodeFacts


def _record(head_facts: NodeFacts) -> dict[str, Any]:
    record = head_facts.file(SERVER_JSON)
    try:
        found = json.loads((record.content if record else None) or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def container_states(node_facts: NodeFacts) -> dict[str, str]:
    """{name: docker's state word} of the node's sparkctl containers (the `managed` fact)."""
    out = {}
    for line in node_facts.output("managed").splitlines():
        name, _, state = line.strip().partition("\t")
        if name:
            out[name] = state.strip() or "unknown"
    return out


def check_server_containers(nodes: dict[str, dict[str, Any]], facts: dict[str, NodeFacts],
                            head: str, server: dict[str, Any]) -> None:
    """Each node of the recorded server must run the server's container; where it does not,
    the node, the server and (vLLM) the Ray count say so now."""
    record = _record(facts.get(head) or NodeFacts(head))
    container = record.get("container")
    if not container:  # (TensorRT-LLM runs in `up`'s container: assess_container judges it)
        return
    gone = {}
    for name in record.get("nodes") or []:
        if name not in facts:  # unreachable: said already
            continue
        state = container_states(facts[name]).get(str(container), "gone")
        if state != "running":
            gone[name] = state
            nodes[name]["problems"].append(
                f"the server's container {container} is {state} here (docker knows at once; "
                f"Ray may still count this node for ~25 s): `sparkctl logs --node {name}` shows "
                f"why; `sparkctl launch {record.get('recipe') or '<recipe>'}` starts it again")
            nodes[name]["state"] = "problem"
    if not gone:
        return
    listing = ", ".join(f"{n} ({s})" for n, s in sorted(gone.items()))
    problem = f"the server's container {container} is not running on {listing}"
    ray = server.get("ray")
    if isinstance(ray, dict) and "alive" in ray:
        ray["alive"] = max(0, min(int(ray["alive"]), int(ray.get("expected") or 0) - len(gone)))
        ray["containers_not_running"] = sorted(gone)
        ray["problem"] = ray.get("problem") or problem
    if server.get("state") in ("healthy", "starting", None):
        server["state"] = "unhealthy"
    server["problem"] = f"{server['problem']}; {problem}" if server.get("problem") else problem
