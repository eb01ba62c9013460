"""`sparkctl status`: what runs on each node and whether it is healthy, read from the nodes.

Everything comes from the nodes in one facts round trip per node (links, our netplan file, container
labels, image digests, the server record and a health probe the head runs against its own
127.0.0.1), never from a controller's cache: status answers the same from any machine.

Exit code: 0 when every node answered and nothing is unhealthy (a cluster that is simply not set
up, or torn down, is healthy); 1 when a node is unreachable or anything is unhealthy (stale or
stopped container, fabric link down or address missing, server starting, down or failing).
"""

from __future__ import annotations

import json
import time
from typing import Any

from orchestrator.commands import quote
from orchestrator.engines import up_container
from orchestrator.engines.liveness import dead_ranks
from orchestrator.errors import SparkctlError
from orchestrator.gateway.control import attach_to_status as attach_gateway
from orchestrator.inventory import Inventory, Node
from orchestrator.node import script
from orchestrator.paths import NETPLAN_FILE, RUN_DIR, SERVER_JSON
from orchestrator.phases.gateway_spec import probe_cmd as gateway_probe_cmd
from orchestrator.phases.managed import managed_ps_cmd
from orchestrator.remote.cluster import parallel
from orchestrator.remote.container import ContainerCommands
from orchestrator.remote.gathered import NodeFacts
from orchestrator.status.containers import check_server_containers
from orchestrator.status.nodes import assess_node, role
from orchestrator.status.server import add_server_problems, assess_server, server_list

LOG_TAIL_LINES = 8

# Runs on the head: the server listens on the head's loopback, so the probe runs there too.
PROBE = script("probe.py")


def status_facts(inventory: Inventory, node: Node) -> dict[str, Any]:
    """One facts request: what status shows, plus what the container step needs to compute the
    config hash `up` would label the container with (so "current/stale" is up's own verdict)."""
    from orchestrator.engines import process_words
    from orchestrator.engines.serverctl import node_cmd
    from orchestrator.phases.boot_units import units_cmd
    from orchestrator.phases.ssh_keys import ENTRYPOINT, SSHD_CONFIG
    from orchestrator.remote.facts import merge_requests
    from orchestrator.status.server import engine_probes, health_arg

    commands = {
        "managed": managed_ps_cmd(inventory, r"{{.Names}}\t{{.State}}"),
        # launch's pid files, checked inside the container the server record names (the pids
        # live in its namespace); without a record, in the `up` container
        "processes": record_container_cmd(inventory, node_cmd(
            "$c", action="status", ours=process_words(),
            ready_log=node.name == inventory.head_name)) + " 2>/dev/null",
        "boot_units": units_cmd(),  # launch --persist (phases/persist.py)
    }
    files = {NETPLAN_FILE: False, ENTRYPOINT: False, SSHD_CONFIG: False}
    if node.name == inventory.head_name:
        # the probe runs on the node, not in the container: it must answer with the container down
        files[SERVER_JSON] = True
        commands["probe"] = " ".join(["python3 -c", quote(PROBE), quote(SERVER_JSON), health_arg()])
        # when the server's container last started: a restart after launch takes the server along
        commands["server_container"] = record_container_cmd(
            inventory, RECORDED.inspect_cmd("{{.Name}} {{.State.StartedAt}}")) + " 2>/dev/null"
        # mpirun's own output, and rank 0's (TensorRT-LLM's engine log) when there is one
        commands["server_log"] = (f"cd {quote(RUN_DIR)} 2>/dev/null && for f in server.log "
                                  'rank-0.log; do [ -s "$f" ] && { echo "==> $f <=="; '
                                  f'tail -n {LOG_TAIL_LINES} "$f"; }}; done; true')
        for name, (key, program) in engine_probes().items():
            commands[key] = record_container_cmd(
                inventory, RECORDED.exec_cmd(["python3", "-c", program]), engine=name)
    # every server on this node (SGLang runs one per node or placement), probed where it runs
    from orchestrator.engines.servers import servers_cmd
    commands["servers"] = servers_cmd(inventory, node, probe=True)
    commands["gateway"] = gateway_probe_cmd(liveliness=True)  # `gateway up` (docs/gateway.md)
    own = {"files": files, "links": True, "ibdev2netdev": True, "commands": commands, "timeout": 40}
    from orchestrator.status.memory import facts_request
    if (up := up_container(inventory)) is None:
        return merge_requests([own, facts_request(inventory)])
    own.update(containers=[up.settings.name], images=[up.settings.image])  # and its spec's facts
    return merge_requests([own, facts_request(inventory), up.spec_facts(inventory, node)])


RECORD_CONTAINER = script("record_container.py")
RECORDED = ContainerCommands("$c")  # the server record's container: record_container_cmd's $c


def record_container_cmd(inventory: Inventory, command: str, engine: str = "") -> str:
    """Run `command` with $c = the container the server record names (default: the `up`
    container); with `engine`, only when the recorded server is that engine's."""
    pick = "python3 -c " + quote(RECORD_CONTAINER) + " " + " ".join(
        quote(a) for a in (SERVER_JSON, inventory.container.name, engine))
    body = command.replace(quote("$c"), '"$c"').replace("'$c'", '"$c"')
    return f'c=$({pick} 2>/dev/null); if [ -n "$c" ]; then {body}; fi'


def gather_status(inventory: Inventory) -> dict[str, Any]:
    """Connect, gather every node's facts in parallel, assess. Unreachable nodes are reported."""
    from orchestrator.core.session import open_session
    from orchestrator.remote.facts import gather_facts

    started = time.monotonic()
    with open_session(inventory, "status", quiet=True) as session:
        errors = {name: host.error for name, host in session.report.hosts.items() if host.error}

        def one(node: Node) -> tuple[str, NodeFacts | str]:
            try:
                return node.name, gather_facts(session.transports[node.name],
                                               status_facts(inventory, node), timeout=90)
            except SparkctlError as exc:
                return node.name, str(exc)

        facts: dict[str, NodeFacts] = {}
        nodes = session.reachable_nodes()
        by_name = {node.name: node for node in nodes}
        answers = parallel(lambda name: one(by_name[name]), by_name, limit=16)
        for name, value in (outcome.get() for outcome in answers.values()):
            if isinstance(value, str):
                errors[name] = value
            else:
                facts[name] = value
        result = assess(inventory, facts, errors)
        result["servers"] = server_list(inventory, facts, result.get("server"))
        attach_gateway(result, facts)
        from orchestrator.status.memory import attach_metrics

        def run_on(node: str, command: str, sudo: bool = False) -> tuple[int, str]:
            done = session.transports[node].run(command, sudo=sudo, timeout=15, display="GET /metrics")
            return done.exit_status, done.stdout

        attach_metrics([s for s in result["servers"] if s.get("node") in session.transports], run_on)
    add_server_problems(result)
    from orchestrator.phases.boot_units import persistence

    units = {name: node.get("boot_units") or {} for name, node in result["nodes"].items()}
    for entry in result["servers"]:
        entry["persistent"] = persistence(units, str(entry["name"]))["persistent"]
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


# ------------------------------------------------------------------ assessment (pure)

def assess(inventory: Inventory, facts: dict[str, NodeFacts], errors: dict[str, str]
           ) -> dict[str, Any]:
    from orchestrator.phases.boot_units import parse_units, persistence

    nodes: dict[str, dict[str, Any]] = {}
    for node in inventory.ordered_nodes():
        if node.name in facts:
            nodes[node.name] = assess_node(inventory, node, facts[node.name])
        else:
            nodes[node.name] = {
                "name": node.name, "host": node.host, "role": role(inventory, node),
                "reachable": False, "state": "unreachable",
                "problems": [f"unreachable: {errors.get(node.name, 'no answer')}"],
            }
    _compare_digests(nodes)
    _compare_setup(nodes)
    from orchestrator.status.memory import attach_node_figures
    attach_node_figures(nodes, facts)  # memory, and the box guard: clock, temperature, throttling
    head = inventory.head_name
    processes = {name: server_processes(node_facts) for name, node_facts in facts.items()}
    server = assess_server(inventory, facts.get(head), nodes[head], dead_ranks(processes),
                           process_answer(facts[head])) if head in facts else None
    server_unknown = None if head in facts else f"the head {head} is unreachable"
    if head in facts and server is None and (nodes[head].get("container") or {}).get("status") == "unknown":
        server_unknown = f"could not look on {head}: {nodes[head]['container'].get('why')}"
    if server is not None and server["problem"]:
        from orchestrator.status.server import named_problem
        nodes[head]["problems"].append(named_problem(server))
        nodes[head]["state"] = "problem"
    if server is not None:
        _check_processes(nodes, facts)
        check_server_containers(nodes, facts, head, server)  # docker's facts before Ray's view
        _memory_guard(nodes, facts, server)
        server["persistence"] = persistence(
            {name: parse_units(f.command("boot_units")) for name, f in facts.items()},
            str(server.get("name") or server.get("recipe")))
    ok = all(not n["problems"] for n in nodes.values())
    return {
        "command": "status", "ok": ok, "cluster": inventory.cluster.name, "head": head,
        "state": cluster_state(nodes, server), "nodes": nodes, "server": server,
        **({"server_unknown": server_unknown} if server_unknown else {}),
    }


def _compare_digests(nodes: dict[str, dict[str, Any]]) -> None:
    digests = {name: (n.get("container") or {}).get("image_id") for name, n in nodes.items()
               if (n.get("container") or {}).get("status") == "running"}
    if len(set(digests.values())) > 1:
        listing = ", ".join(f"{name} -> {value}" for name, value in digests.items())
        for name in digests:
            nodes[name]["problems"].append(f"containers run different images: {listing}")
            nodes[name]["state"] = "problem"


def process_answer(facts: NodeFacts) -> dict[str, Any]:
    """The node's server-control answer (pid files, whether the engine logged ready), or {}."""
    answer = facts.command("processes")
    if answer is None or answer.rc != 0:
        return {}
    try:
        found = json.loads(answer.out or "{}")
    except json.JSONDecodeError:
        return {}
    return found if isinstance(found, dict) else {}


def server_processes(facts: NodeFacts) -> dict[str, dict[str, Any]]:
    """launch's pid files on a node ({"rank-1.pid": {"pid": 42, "alive": True}}), or {}."""
    pids = process_answer(facts).get("pids")
    return dict(pids) if isinstance(pids, dict) else {}


def _check_processes(nodes: dict[str, dict[str, Any]], facts: dict[str, NodeFacts]) -> None:
    """With a server recorded, every process launch recorded must still run."""
    for name, node_facts in facts.items():
        processes = server_processes(node_facts)
        nodes[name]["processes"] = processes
        dead = sorted(f"{pid_file.removesuffix('.pid')} (pid {info.get('pid')})"
                      for pid_file, info in processes.items() if not info.get("alive"))
        if dead:
            nodes[name]["problems"].append(f"server process ended: {', '.join(dead)}; "
                                           "`sparkctl logs` shows why")
            nodes[name]["state"] = "problem"


def _memory_guard(nodes: dict[str, dict[str, Any]], facts: dict[str, NodeFacts],
                  server: dict[str, Any]) -> None:
    """A node where the memory guard stopped the server: say so, with its figures."""
    from orchestrator.phases.memory import describe_stop, stop_record

    for name, node_facts in facts.items():
        try:
            record = stop_record(json.loads(node_facts.output("processes") or "{}"))
        except (json.JSONDecodeError, AttributeError):
            record = None
        if record:
            text = describe_stop(record)
            nodes[name]["problems"].append(text)
            nodes[name]["state"] = "problem"
            server["state"] = (f"stopped by the memory guard: {record.get('available_gb')} GB "
                               f"available < {record.get('min_available_gb')} GB on {name}")
            server["problem"] = text


def _compare_setup(nodes: dict[str, dict[str, Any]]) -> None:
    """Half a cluster set up is a problem even when each half looks fine on its own."""
    reached = [n for n in nodes.values() if n["reachable"]]
    running = [n for n in reached if (n.get("container") or {}).get("status") == "running"]
    configured = [n for n in reached if (n.get("network") or {}).get("configured")]
    for node in reached:
        if running and node not in running and (node.get("container") or {}).get("status") == "absent":
            node["problems"].append("no container here while other nodes run theirs (run `sparkctl up`)")
            node["state"] = "problem"
        if configured and node not in configured:
            node["problems"].append(
                "fabric not configured here while other nodes have it (run `sparkctl up`)")
            node["state"] = "problem"


def cluster_state(nodes: dict[str, dict[str, Any]], server: dict[str, Any] | None) -> str:
    states = {n["state"] for n in nodes.values()}
    if "unreachable" in states or "problem" in states:
        return "degraded"
    if server is not None and server.get("state") == "healthy":
        return "serving"
    if states == {"up"}:
        return "up"
    if states <= {"network-only", "not-set-up"}:
        return "network-only" if "network-only" in states else "not-set-up"
    return "partial"
