"""The server's part of `sparkctl status`: its record and probes judged (pure), whichever engine
serves it (TensorRT-LLM's /health_generate, vLLM's Ray cluster): healthy, starting (never ready
yet), stalled (ready once, no answer now), dead (a rank process ended), unhealthy or down
(engines/liveness.py)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from orchestrator.engines import DEFAULT_ENGINE, REGISTRY, get_engine
from orchestrator.engines.apikey import probe_host
from orchestrator.engines.capabilities import ProbesStatus
from orchestrator.engines.liveness import READY_KEY, judge, was_ready
from orchestrator.inventory import Inventory
from orchestrator.paths import SERVER_JSON
from orchestrator.records import Server, ServerRecord
from orchestrator.remote.fact_records import CommandResult
from orchestrator.remote.gathered import NodeFacts
from orchestrator.timestamps import age, parse_time


def assess_server(inventory: Inventory, facts: NodeFacts | None, head: dict[str, Any],
                  dead: list[str] | None = None, processes: dict[str, Any] | None = None,
                  ) -> dict[str, Any] | None:
    """The recorded server's state; `dead` names the rank processes that ended on any node and
    `processes` is the head's pid-file answer (its main process, whether the engine logged it
    was ready)."""
    if facts is None:
        return None
    record = facts.file(SERVER_JSON)
    if record is None or not record.exists:
        return None
    try:
        server = json.loads(record.content or "{}")
    except json.JSONDecodeError:
        server = {}
    log_tail = facts.output("server_log").splitlines()
    try:
        probe = json.loads(facts.output("probe") or "{}")
    except json.JSONDecodeError:
        probe = {"error": "the health probe printed no JSON"}
    port = server.get("port")
    engine = server.get("engine", DEFAULT_ENGINE)
    out: dict[str, Any] = {
        "engine": engine, "recipe": server.get("recipe"), "model": server.get("model"),
        "name": server.get("name") or server.get("recipe"),
        "draft_model": server.get("draft_model"), "port": port,
        "endpoint": f"http://{probe_host(str(server.get('host') or ''))}:{port}",
        "node": inventory.head_name,
        "started": server.get("started"), "uptime_seconds": age(server.get("started"), facts.time),
        "health": probe, "log_tail": log_tail, "problem": "",
    }
    container_running = (head.get("container") or {}).get("status") == "running"
    health = probe.get("/health")
    second = engine_of_record(engine).readiness.status_paths[1]  # after /health: the engine's own
    pids = (processes or {}).get("pids") or {}
    main = pids.get(str(server.get("main") or "mpirun.pid"))
    ready = was_ready(server, bool((processes or {}).get("ready_log")))
    out["ready_at"] = server.get(READY_KEY)
    own = engine_of_record(engine)
    probes = own.name == engine and isinstance(own, ProbesStatus)  # (not the default's)
    probe_key = own.status_probe()[0] if probes else ""
    judged = (own.judge_probe(ServerRecord.from_dict(server), facts.command(probe_key))
              if probe_key else {})
    if judged:  # the engine's own probe (vLLM over Ray: every serving node alive in Ray)
        out[probe_key] = judged
    if not container_running:
        out["state"] = "down"
        out["problem"] = "server recorded but the head container is not running"
        return out
    restarted = container_restarted(server, facts.command("server_container"),
                                    bool(main.get("alive")) if isinstance(main, dict) else None)
    if restarted and not (health == 200 and probe.get(second) == 200):  # (answering: it came back)
        out["state"] = "down"
        out["problem"] = (f"{restarted}; the server did not come back with it: run "
                          f"{relaunch_hint(server)} again")
        return out
    verdict = judge(health if health is not None else probe.get("error"), ready, dead or [],
                    (second, probe.get(second)) if health == 200 else None, port,
                    main_alive=bool(main.get("alive")) if isinstance(main, dict) else None)
    out["state"], out["problem"] = verdict.state, verdict.problem
    own_problem = (out.get(probe_key) or {}).get("problem") if probe_key else None
    if own_problem and verdict.restart:
        out["problem"] += f"; {own_problem}"
    elif own_problem:
        out["state"], out["problem"] = "unhealthy", own_problem
    return out


def engine_of_record(engine: str) -> Any:
    """The engine a record names (an unknown one: the default's probes)."""
    return get_engine(engine if engine in REGISTRY else DEFAULT_ENGINE)


def named_problem(server: dict[str, Any]) -> str:
    """The recorded server's problem, named (several servers may run)."""
    name = server.get("name") or server.get("recipe")
    return f"server {name} ({server.get('engine')}): {server['problem']}"


def health_paths() -> dict[str, Any]:
    """Every engine's status paths (Engine.readiness.status_paths) for the node's probe."""
    return {"paths": {name: list(get_engine(name).readiness.status_paths) for name in sorted(REGISTRY)},
            "default": DEFAULT_ENGINE}


def health_arg() -> str:
    """health_paths() as the node's probe takes it (one quoted JSON argument)."""
    from orchestrator.commands import quote

    return quote(json.dumps(health_paths(), sort_keys=True))


def engine_probes() -> dict[str, tuple[str, str]]:
    """Each engine's own status probe (Engine.status_probe), by engine name."""
    engines = {name: get_engine(name) for name in sorted(REGISTRY)}
    return {name: engine.status_probe() for name, engine in engines.items()
            if isinstance(engine, ProbesStatus)}


RESTART_MARGIN_SECONDS = 5
"""The server's start time is the controller's clock to the second, the container's the node's:
a restart counts only when the container started clearly later (and the server's process is
gone), so a few seconds of clock skew never report a healthy server as restarted."""


def container_restarted(server: dict[str, Any], answer: CommandResult | None,
                        server_alive: bool | None) -> str:
    """'the head's container X restarted at T, after the server started at S', or ''.

    A container restarted after launch (a node reboot with a restart policy, `docker restart`,
    the engine's container crashing and coming back) starts from its command: the server and,
    for vLLM, the Ray head it ran on are gone even though the container runs."""
    name, _, started_at = (answer.out.strip() if answer else "").partition(" ")
    if server_alive or (answer is not None and answer.rc != 0) or not started_at or not server.get("started"):
        return ""
    container_up, server_up = parse_time(started_at), parse_time(server["started"])
    if container_up is None or server_up is None or container_up <= server_up + RESTART_MARGIN_SECONDS:
        return ""
    return (f"the head's container {name.lstrip('/')} restarted at "
            f"{datetime.fromtimestamp(container_up).astimezone():%H:%M:%S}, after the server "
            f"started at {datetime.fromtimestamp(server_up).astimezone():%H:%M:%S}")


SERVER_KEYS = ("name", "engine", "recipe", "model", "node", "nodes", "port", "alive", "health",
               "container", "started", "memory_gb", "legacy", "processes", "dead_nodes",
               "memguard", "ended", "host", "api_key_file", "keyless", "persistent",
               "recipe_file", "ranks")
"""(`host` and `api_key_file`: where the server binds and its API key's node file, if it has
one; the metrics fetch uses both, and a reader sees the server is protected, never the key;
`keyless`: what a guarded path answered without the key, 401/403 when it is enforced.)"""


# the recorded server's verdict (assess_server) in the servers list's words
LISTED_STATE = {"starting": "loading", "unhealthy": "not answering", "down": "stopped"}


def server_list(inventory: Inventory, facts: dict[str, NodeFacts],
                recorded: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every server on every node (from the same facts round trip): name, engine, node(s),
    port, health as probed on its node, and a state word. A server an earlier sparkctl
    launched (`legacy`: its single record migrated) that `status` also assessed in full as
    `recorded` (the read that migrated it saw the old record too) gets that verdict, so both
    never disagree."""
    from orchestrator.engines.servers import from_facts

    out = []
    for server in from_facts(facts, alive_only=False):
        shown = server.to_dict()
        entry = {k: shown.get(k) for k in SERVER_KEYS}
        entry["state"] = (LISTED_STATE.get(recorded["state"], recorded["state"])
                          if server.migrated and recorded else server_state(server))
        out.append(entry)
    return out


def server_state(server: Server) -> str:
    """healthy, loading (never ready yet), stalled (ready once, no answer now), not answering,
    dead (its container exited: SGLang ends every rank when one dies), guard-stopped (the memory
    guard stopped it) or stopped."""
    from orchestrator.engines.liveness import judge, was_ready

    if server.memguard and not server.alive:
        return "guard-stopped"
    if not server.alive:
        return "dead"
    verdict = judge(server.health, was_ready(server.record.to_dict(), server.ready_log))
    return {"healthy": "healthy", "starting": "loading", "stalled": "stalled"}.get(
        verdict.state, "not answering")


BAD_STATES = ("dead", "stalled", "not answering", "guard-stopped")


def relaunch_hint(entry: dict[str, Any]) -> str:
    """`sparkctl launch ...` that starts the listed server again as it was recorded: its
    name, nodes and port, where it bound (a key file for a bind beyond loopback: the user's
    own, which no record holds) and --persist."""
    from orchestrator.commands import quote

    nodes = [str(n) for n in entry.get("nodes") or [entry.get("node")] if n]
    recipe = entry.get("recipe_file") or entry.get("recipe") or "<recipe>"
    words = [f"sparkctl launch {quote(str(recipe))}"]
    if entry.get("name") and entry.get("name") != entry.get("recipe"):
        words.append(f"--name {entry['name']}")
    if nodes:
        words.append(f"--nodes {','.join(nodes)}")
    if entry.get("port"):
        words.append(f"--port {entry['port']}")
    host = str(entry.get("host") or "127.0.0.1")
    if host not in ("127.0.0.1", "localhost", "::1"):
        words.append(f"--host {host}")
    if entry.get("api_key_file"):
        words.append("--api-key-file FILE")
    if entry.get("persistent"):
        words.append("--persist")
    return "`" + " ".join(words) + "`"


def key_state(entry: dict[str, Any]) -> str | None:
    """None (no key), "enforced" (a guarded path refused without it), "not enforced" (it
    answered 200 without it) or "unverified" (not asked: the server did not answer)."""
    if not entry.get("api_key_file"):
        return None
    keyless = entry.get("keyless")
    if keyless in (401, 403):
        return "enforced"
    return "not enforced" if keyless == 200 else "unverified"


def server_problem(entry: dict[str, Any], assessed: bool = False) -> str | None:
    """What status says (and exits 1 for) about one listed server that does not serve
    (`assessed`: the single recorded server, assessed in full by assess_server)."""
    state = entry.get("state")
    if assessed or (state not in BAD_STATES and key_state(entry) != "not enforced"):
        return None
    nodes = entry.get("nodes") or [entry.get("node")]
    what = (f"server {entry.get('name')} ({entry.get('engine')}, {entry.get('model')} on "
            f"{', '.join(map(str, nodes))})")
    if key_state(entry) == "not enforced":
        return (f"{what} has an API key but answers /v1/models without it (HTTP "
                f"{entry.get('keyless')}): anyone reaching {entry.get('host')}:{entry.get('port')} "
                f"is served; relaunch it with a valid key: {relaunch_hint(entry)} --replace")
    relaunch = f"{relaunch_hint(entry)} starts it again"
    if state == "guard-stopped":
        guard = entry.get("memguard") or {}
        return (f"{what} was stopped by the memory guard at {guard.get('available_gb', '?')} GB "
                f"available (< {guard.get('min_available_gb', '?')} GB on {guard.get('node', '?')} "
                f"at {guard.get('time', '?')}): free memory there, then {relaunch}")
    if state == "dead":
        why = (f"{', '.join(entry['ended'])} ended" if entry.get("ended")
               else "its container is gone or exited")
        return (f"{what} is dead: {why}; `sparkctl logs --server "
                f"{entry.get('name')}` shows why; {relaunch}")
    if state == "stalled":
        return (f"{what} is stalled: it was ready and /health now answers "
                f"{entry.get('health') or 'nothing'}; {relaunch} (a relaunch restarts it)")
    return f"{what} does not answer /health ({entry.get('health') or 'no answer'}); see `sparkctl logs`"


def add_server_problems(result: dict[str, Any]) -> None:
    """Every listed server that does not serve is a problem on its first node: status exits 1
    naming it (the cluster is degraded), whichever engine serves it. A cluster that is up and
    whose named server serves is "serving" (as with the single recorded one)."""
    if result.get("state") == "up" and any(s.get("state") == "healthy"
                                           for s in result.get("servers") or []):
        result["state"] = "serving"
    for entry in result.get("servers") or []:
        guard, server = entry.get("memguard"), result.get("server")
        if entry.get("legacy") and isinstance(guard, dict) and isinstance(server, dict):
            # the single recorded server (assessed in full) stopped by a guard on its node
            server["state"] = (f"stopped by the memory guard: {guard.get('available_gb')} GB "
                               f"available < {guard.get('min_available_gb')} GB on {guard.get('node')}")
            entry["state"] = "guard-stopped"
        assessed = bool(entry.get("legacy")) and isinstance(server, dict)
        problem = server_problem(entry, assessed and not entry.get("memguard"))
        if problem and entry.get("legacy") and isinstance(server, dict):
            server["problem"] = problem
        node = result["nodes"].get(str((entry.get("nodes") or [entry.get("node")])[0]))
        if problem is None or node is None:
            continue
        node["problems"].append(problem)
        node["state"] = "problem"
        result["ok"] = False
        result["state"] = "degraded"
