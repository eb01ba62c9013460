"""The server's part of `sparkctl status`: its record and probes judged (pure), whichever engine
serves it (TensorRT-LLM's /health_generate, vLLM's Ray cluster): healthy, starting (never ready
yet), stalled (ready once, no answer now), dead (a rank process ended), unhealthy or down
(engines/liveness.py)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from orchestrator.engines.liveness import READY_KEY, judge, was_ready
from orchestrator.inventory import Inventory
from orchestrator.paths import SERVER_JSON
from orchestrator.timestamps import age, parse_time


def assess_server(inventory: Inventory, facts: dict[str, Any] | None, head: dict[str, Any],
                  dead: list[str] | None = None, processes: dict[str, Any] | None = None,
                  ) -> dict[str, Any] | None:
    """The recorded server's state; `dead` names the rank processes that ended on any node and
    `processes` is the head's pid-file answer (its main process, whether the engine logged it
    was ready)."""
    if facts is None:
        return None
    record = ((facts.get("files") or {}).get(SERVER_JSON) or {})
    if not record.get("exists"):
        return None
    try:
        server = json.loads(record.get("content") or "{}")
    except json.JSONDecodeError:
        server = {}
    commands = facts.get("commands") or {}
    log_tail = ((commands.get("server_log") or {}).get("out") or "").splitlines()
    try:
        probe = json.loads((commands.get("probe") or {}).get("out") or "{}")
    except json.JSONDecodeError:
        probe = {"error": "the health probe printed no JSON"}
    port = server.get("port")
    engine = server.get("engine", "trtllm")
    out: dict[str, Any] = {
        "engine": engine, "recipe": server.get("recipe"), "model": server.get("model"),
        "draft_model": server.get("draft_model"), "port": port,
        "endpoint": f"http://127.0.0.1:{port}", "node": inventory.head_name,
        "started": server.get("started"), "uptime_seconds": age(server.get("started"), facts.get("time")),
        "health": probe, "log_tail": log_tail, "problem": "",
    }
    container_running = (head.get("container") or {}).get("status") == "running"
    health = probe.get("/health")
    second = "/health_generate" if engine == "trtllm" else "/v1/models"
    pids = (processes or {}).get("pids") or {}
    main = pids.get(str(server.get("main") or "mpirun.pid"))
    ready = was_ready(server, bool((processes or {}).get("ready_log")))
    out["ready_at"] = server.get(READY_KEY)
    if engine == "vllm" and server.get("executor", "ray") == "ray":  # mp: no Ray to ask
        out["ray"] = assess_ray(server, commands.get("ray") or {})
    if not container_running:
        out["state"] = "down"
        out["problem"] = "server recorded but the head container is not running"
        return out
    restarted = container_restarted(server, commands.get("server_container") or {},
                                    bool(main.get("alive")) if isinstance(main, dict) else None)
    if restarted and not (health == 200 and probe.get(second) == 200):  # (answering: it came back)
        out["state"] = "down"
        out["problem"] = (f"{restarted}; the server did not come back with it: run `sparkctl launch "
                          f"{server.get('recipe') or '<recipe>'}` again")
        return out
    verdict = judge(health if health is not None else probe.get("error"), ready, dead or [],
                    (second, probe.get(second)) if health == 200 else None, port,
                    main_alive=bool(main.get("alive")) if isinstance(main, dict) else None)
    out["state"], out["problem"] = verdict.state, verdict.problem
    ray_problem = (out.get("ray") or {}).get("problem")
    if ray_problem and verdict.restart:
        out["problem"] += f"; {ray_problem}"
    elif ray_problem:
        out["state"], out["problem"] = "unhealthy", ray_problem
    return out


RESTART_MARGIN_SECONDS = 5
"""The server's start time is the controller's clock to the second, the container's the node's:
a restart counts only when the container started clearly later (and the server's process is
gone), so a few seconds of clock skew never report a healthy server as restarted."""


def container_restarted(server: dict[str, Any], answer: dict[str, Any],
                        server_alive: bool | None) -> str:
    """'the head's container X restarted at T, after the server started at S', or ''.

    A container restarted after launch (a node reboot with a restart policy, `docker restart`,
    the engine's container crashing and coming back) starts from its command: the server and,
    for vLLM, the Ray head it ran on are gone even though the container runs."""
    name, _, started_at = ((answer.get("out") or "").strip()).partition(" ")
    if server_alive or answer.get("rc") not in (0, None) or not started_at or not server.get("started"):
        return ""
    container_up, server_up = parse_time(started_at), parse_time(server["started"])
    if container_up is None or server_up is None or container_up <= server_up + RESTART_MARGIN_SECONDS:
        return ""
    return (f"the head's container {name.lstrip('/')} restarted at "
            f"{datetime.fromtimestamp(container_up).astimezone():%H:%M:%S}, after the server "
            f"started at {datetime.fromtimestamp(server_up).astimezone():%H:%M:%S}")


def assess_ray(server: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """vLLM's Ray cluster as its head reports it: every node the server runs on must be alive."""
    from orchestrator.engines.vllm.ray import parse_probe

    probe: dict[str, Any] = (parse_probe(answer) if answer.get("out") or answer.get("rc")
                             else {"error": "no answer"})
    nodes = probe.get("nodes") or []
    alive = sorted(n.get("ip") for n in nodes if n.get("alive"))
    want = len(server.get("nodes") or []) or 1
    out: dict[str, Any] = {"nodes": nodes, "alive": len(alive), "expected": want, "problem": ""}
    if probe.get("error"):
        out["error"] = probe["error"]
        out["problem"] = f"the Ray cluster does not answer: {probe['error']}"
    elif len(alive) < want:
        out["problem"] = (f"Ray has {len(alive)} of {want} node(s) alive ({', '.join(alive) or 'none'}): "
                          "a worker's container or link is down; see `sparkctl logs`")
    return out


SERVER_KEYS = ("name", "engine", "recipe", "model", "node", "nodes", "port", "alive", "health",
               "container", "started", "memory_gb", "legacy", "processes", "dead_nodes")


# the recorded server's verdict (assess_server) in the servers list's words
LISTED_STATE = {"starting": "loading", "unhealthy": "not answering", "down": "stopped"}


def server_list(inventory: Inventory, facts: dict[str, dict[str, Any]],
                recorded: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every server on every node (from the same facts round trip): name, engine, node(s),
    port, health as probed on its node, and a state word. The recorded server (`legacy`, the
    one `status` assessed in full as `recorded`) gets that verdict, so both never disagree."""
    from orchestrator.engines.servers import from_facts

    out = []
    for server in from_facts(facts, inventory, alive_only=False):
        entry = {k: server.get(k) for k in SERVER_KEYS}
        entry["state"] = (LISTED_STATE.get(recorded["state"], recorded["state"])
                          if server.get("legacy") and recorded else server_state(server))
        out.append(entry)
    return out


def server_state(server: dict[str, Any]) -> str:
    """healthy, loading (never ready yet), stalled (ready once, no answer now), not answering,
    dead (its container exited: SGLang ends every rank when one dies) or stopped."""
    from orchestrator.engines.liveness import judge, was_ready

    if not server.get("alive"):
        return "stopped" if server.get("legacy") else "dead"
    verdict = judge(server.get("health"), was_ready(server, bool(server.get("ready_log"))))
    return {"healthy": "healthy", "starting": "loading", "stalled": "stalled"}.get(
        verdict.state, "not answering")
