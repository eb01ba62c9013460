"""Every server on the cluster, whichever engine runs it, and the rules for one more.

Every server has its directory RUN_DIR/servers/<name>/ on each of its nodes and its record
server.json there on its first node (the one it answers on); vLLM still keeps its single record,
RUN_DIR/server.json on the head, as TensorRT-LLM did before its servers had names (such a
"legacy" record is still listed, stopped and replaced). `orchestrator/node/servers.py` lists
both on a node (one command per node, so launch gathers it as a fact). A new server is judged against the live
ones sharing a node with it: a port already taken there is refused (named), and the sum of the
recorded per-node memory estimates plus the new one must fit in a Spark's unified memory
(refused with the numbers, unless --ignore-memory). Servers on other nodes are never in the way,
whatever their engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.engines import DEFAULT_ENGINE, ready_lines
from orchestrator.errors import InputError, SparkctlError
from orchestrator.paths import RUN_DIR
from orchestrator.recipe import SPARK_MEMORY_GB
from orchestrator.remote.gathered import NodeFacts

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.remote.transport import Transport

SERVERS_DIR = f"{RUN_DIR}/servers"


def record_dir(name: str) -> str:
    return f"{SERVERS_DIR}/{name}"


def servers_cmd(inventory: Inventory, node: Node | None = None, probe: bool = False,
                legacy: bool = True) -> str:
    """The node's servers as JSON (the head also lists the older single record)."""
    from orchestrator.node import script

    head = legacy and (node is None or node.name == inventory.head_name)
    args = {"run": RUN_DIR, "probe": probe, "ready_lines": ready_lines(),
            "legacy_container": inventory.container.name if head else None,
            "default_engine": DEFAULT_ENGINE, "serverctl": script("serverctl.py")}
    return "python3 -c " + quote(script("servers.py")) + " " + quote(json.dumps(args, sort_keys=True))


def parse(out: str, node: str, inventory: Inventory) -> list[dict[str, Any]]:
    try:
        found = json.loads(out or "{}").get("servers") or []
    except ValueError:
        return []
    servers = []
    for record in found:
        if not isinstance(record, dict):
            continue
        record["node"] = node
        if not record.get("nodes"):  # TensorRT-LLM: the head and the next tp_size - 1 nodes
            count = int(record.get("tp_size") or 1)
            record["nodes"] = [n.name for n in inventory.ordered_nodes()[:count]]
        servers.append(record)
    return servers


def members(out: str) -> dict[str, Any] | None:
    """A node's containers of named servers, by server name (node/servers.py's "members");
    None when the answer has none (no verdict on that node then)."""
    try:
        found = json.loads(out or "{}").get("members")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, dict) else None


def attach_members(servers: list[dict[str, Any]], by_node: dict[str, dict[str, Any]]) -> None:
    """Each named server's processes on every node it spans (what status shows: RSS, process);
    one whose container ended on another node (an rpc-server, a rank) is not alive: it cannot
    serve, whatever its first node's /health says."""
    for server in servers:
        if server.get("legacy"):
            continue
        processes, gone, ended = [], [], []
        for node in server.get("nodes") or [server.get("node")]:
            if node not in by_node:
                continue  # not asked (unreachable, or not part of this gathering)
            member = by_node[node].get(str(server.get("name")))
            if isinstance(member, dict) and member.get("memguard") and not server.get("memguard"):
                server["memguard"] = member["memguard"]  # the guard that stopped it, on a member
            if not isinstance(member, dict) or not member.get("running"):
                gone.append(node)
                ended += [f"{what} on {node}" for what in (member or {}).get("ended") or []]
                continue
            processes.append({"node": node, "process": member.get("process"),
                              "rss_mb": round(int(member.get("rss_kb") or 0) / 1024, 1)})
        server["processes"] = processes
        if ended:  # a process server's processes that ended (a rank, mpirun)
            server["ended"] = ended
        if gone and server.get("alive"):
            server["alive"] = False
            server["dead_nodes"] = gone


def from_facts(cluster_facts: dict[str, NodeFacts], inventory: Inventory,
               alive_only: bool = True) -> list[dict[str, Any]]:
    """Every (live) server from each node's `servers` command fact."""
    out, by_node = [], {}
    for node, facts in sorted(cluster_facts.items()):
        found = members(facts.output("servers"))
        if found is not None:
            by_node[node] = found
        out += parse(facts.output("servers"), node, inventory)
    attach_members(out, by_node)
    return [s for s in out if s.get("alive") or not alive_only]


def gather(transports: dict[str, Transport], inventory: Inventory, probe: bool = False,
           alive_only: bool = True, legacy: bool = True) -> list[dict[str, Any]]:
    """Every server, asked of every reachable node in parallel (chat, tunnel, bench, status)."""
    from orchestrator.remote.cluster import parallel

    def one(name: str) -> str | None:
        result = transports[name].run(servers_cmd(inventory, inventory.node(name), probe, legacy),
                                      sudo=True, timeout=120, display="the servers on this node")
        return result.stdout if result.ok else None

    out: list[dict[str, Any]] = []
    by_node: dict[str, dict[str, Any]] = {}
    for name, outcome in parallel(one, sorted(transports)).items():
        if outcome.ok and outcome.get() is not None:
            found = members(outcome.get() or "")
            if found is not None:
                by_node[name] = found
            out += parse(outcome.get() or "", name, inventory)
    attach_members(out, by_node)
    return [s for s in out if s.get("alive") or not alive_only]


def pick(servers: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    """The server NAME, or the only one; several without a name: ask for --server."""
    if name:
        named = [s for s in servers if s.get("name") == name]
        if named:
            return named[0]
        listing = ", ".join(sorted(str(s.get("name")) for s in servers)) or "none"
        raise InputError(f"no server named {name!r} runs (running: {listing})")  # --server
    if not servers:
        raise SparkctlError("no model server is running: start one with `sparkctl launch RECIPE`")
    if len(servers) > 1:
        listing = ", ".join(f"{s.get('name')} ({s.get('engine')} on {s.get('node')}, port "
                            f"{s.get('port')})" for s in servers)
        raise InputError(f"{len(servers)} servers run: {listing}; pick one with --server NAME")
    return servers[0]


@dataclass
class Wanted:
    """The server a launch wants to start, as the placement rules see it."""

    name: str
    engine: str
    model: str
    nodes: list[str]
    ports: list[int]
    memory_gb: float
    config_hash: str
    extra: dict[str, Any] = field(default_factory=dict)


def memory_of(server: dict[str, Any]) -> float | None:
    """A running server's recorded per-node estimate; older records: its recipe's estimate."""
    if isinstance(server.get("memory_gb"), (int, float)):
        return float(server["memory_gb"])
    try:
        from orchestrator.engines import engine_of, load_recipe

        recipe = load_recipe(str(server.get("recipe")))
        return float(engine_of(recipe).estimate_memory(recipe).total_gb)
    except (SparkctlError, OSError, ValueError):
        return None


def ports_of(server: dict[str, Any]) -> set[int]:
    ports = {int(server["port"])} if server.get("port") else set()
    if server.get("dist_port") and len(server.get("nodes") or []) > 1:
        ports.add(int(server["dist_port"]))
    # every other port the server binds, where its record lists them (vLLM's Ray ports)
    ports.update(int(p) for p in server.get("listen_ports") or [] if isinstance(p, int))
    return ports


def record_cmd(name: str, record: dict[str, Any]) -> str:
    """The node command that writes a server's record, RUN_DIR/servers/<name>/server.json
    (atomically: status and a relaunch never read half of it)."""
    path = f"{record_dir(name)}/server.json"
    text = json.dumps(record, indent=1, sort_keys=True)
    return (f"install -d -m 0755 {quote(record_dir(name))} && "
            f"printf '%s\\n' {quote(text)} > {quote(path + '.tmp')} && "
            f"mv -f {quote(path + '.tmp')} {quote(path)}")


def judge(wanted: Wanted, running: list[dict[str, Any]], replace: bool,
          ignore_memory: bool) -> tuple[str, dict[str, Any] | None]:
    """("start" | "same" | "replace", the server replaced) or SparkctlError naming why not."""
    same = next((s for s in running if s.get("name") == wanted.name), None)
    others = [s for s in running if s is not same]
    decision: tuple[str, dict[str, Any] | None] = ("start", None)
    if same is not None:
        if same.get("config_hash") == wanted.config_hash and same.get("engine") == wanted.engine:
            decision = ("same", same)
        elif not replace:
            raise SparkctlError(
                f"a server named {wanted.name} already runs ({same.get('engine')}, "
                f"{same.get('model')} on {', '.join(same.get('nodes') or [])}, started "
                f"{same.get('started', '?')}) with another configuration: pass --replace, give "
                f"this one another name (--name), or stop it (`sparkctl down --server {wanted.name}`)")
        else:
            decision = ("replace", same)
    for node in wanted.nodes:
        here = [s for s in others if node in (s.get("nodes") or [])]
        for other in here:
            taken = ports_of(other) & set(wanted.ports)
            if taken:
                port = sorted(taken)[0]
                raise SparkctlError(
                    f"port {port} on {node} is taken by server {other.get('name')} "
                    f"({other.get('engine')}, {other.get('model')}): launch with another --port "
                    f"or stop it first (`sparkctl down --server {other.get('name')}`)")
        if ignore_memory or not here:
            continue
        used = [(str(o.get("name")), memory_of(o)) for o in here]
        total = sum(gb or 0.0 for _, gb in used) + wanted.memory_gb
        if total > SPARK_MEMORY_GB:
            parts = " + ".join(f"{gb:.1f} GB ({n})" if gb is not None else f"? GB ({n})"
                               for n, gb in used)
            raise InputError(  # a refusal, as the memory step's: exit 2 (docs/recipes.md)
                f"{node}: {parts} already running + {wanted.memory_gb:.1f} GB ({wanted.name}) = "
                f"{total:.1f} GB > {SPARK_MEMORY_GB:g} GB of unified memory: place it on another "
                f"node (--nodes), lower memory.kv_cache_fraction, stop "
                + ", ".join(f"`sparkctl down --server {n}`" for n, _ in used)
                + ", or pass --ignore-memory")
    return decision


def stop_commands(server: dict[str, Any], inventory: Inventory) -> dict[str, str]:
    """Per node, the command that stops one server and removes its record."""
    from orchestrator.commands import docker_cmd

    if server.get("legacy"):
        from orchestrator.paths import SERVER_JSON

        command = stop_command(inventory, server)
        if server.get("api_key_file") and server.get("name"):  # its key goes with it
            command += f"; rm -rf -- {quote(record_dir(str(server['name'])))}"
        nodes = server.get("nodes") or [inventory.head_name]
        # the record goes too (on the head): the server is gone, not "stopped" forever
        return {name: command + (f"; rm -f {quote(SERVER_JSON)}"
                                 if name == inventory.head_name else "") for name in nodes}
    name = str(server["name"])
    ids = docker_cmd("ps", "-aq", "--filter", "label=sparkctl.managed=true", "--filter",
                     f"label=sparkctl.cluster={inventory.cluster.name}", "--filter",
                     f"label=sparkctl.server={name}")
    remove = (f"ids=$({ids}); [ -z \"$ids\" ] || {docker_cmd('rm', '-f')} $ids >/dev/null; "
              f"rm -rf -- {quote(record_dir(name))}")
    if server.get("main"):  # processes in a shared container: stopped by their pid files there
        from orchestrator.engines.serverctl import node_cmd

        stop = node_cmd(str(server.get("container") or inventory.container.name), action="stop",
                        run=record_dir(name), ours=server.get("ours"))
        remove = f"{{ {stop} >/dev/null 2>&1 || true; }}; {remove}"
    if server.get("port_guard"):  # its firewall chain (phases/port_guards.py) goes with it
        from orchestrator.phases.port_guards import remove_cmd

        remove += f" && {remove_cmd(str(server['port_guard']))} >/dev/null"
    return {node: remove for node in server.get("nodes") or [server.get("node")]}


def stop_server(transports: dict[str, Any], inventory: Inventory, server: dict[str, Any]) -> None:
    for node, command in stop_commands(server, inventory).items():
        if node in transports:
            transports[node].run(command, sudo=True, timeout=120,
                                 display=f"stop server {server.get('name')} on {node}").check()


def down_phase(inventory: Inventory, name: str, keep_logs: bool = False) -> Any:
    """`sparkctl down --server NAME`: that server's containers and record on its nodes only."""
    from orchestrator.core.step import Phase
    from orchestrator.phases import gateway_down, persist_down
    from orchestrator.remote.facts import merge_requests

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        return merge_requests([{"commands": {"servers": servers_cmd(inv, node)}},
                               persist_down.facts(inv), gateway_down.server_relay_facts(name)])

    # its boot unit first (launch --persist), so a reboot cannot bring it back meanwhile
    from orchestrator.engines import server_containers

    return Phase("stop-server", [gateway_down.LeaveGateway(name),  # drained before it stops
                                 persist_down.RemoveBootUnits(name, server_containers(name)),
                                 StopNamed(name), persist_down.RemoveBootLogs(name, keep_logs)],
                 facts)


class StopNamed(Step):
    name = "stop-server"

    def __init__(self, server: str) -> None:
        self.server = server

    def check(self, ctx: NodeContext) -> Outcome:
        found = [s for s in from_facts(ctx.cluster_facts, ctx.inventory, alive_only=False)
                 if s.get("name") == self.server]
        if not found:
            listing = ", ".join(sorted({str(s.get("name")) for s in from_facts(
                ctx.cluster_facts, ctx.inventory)})) or "none"
            raise SparkctlError(f"no server named {self.server!r} (running: {listing})")
        server = found[0]
        command = stop_commands(server, ctx.inventory).get(ctx.node.name)
        if command is None:
            return Unchanged(f"{self.server} does not run here")
        gone = "its record" + (f" and its port guard (firewall chain {server['port_guard']})"
                               if server.get("port_guard") else "")
        return Change(f"stop {self.server} ({server.get('engine')}, {server.get('model')}) and "
                      f"remove {gone}", commands=(command,))


def stop_command(inventory: Inventory, running: dict[str, Any]) -> str:
    """How the single recorded server (vLLM's, or an earlier sparkctl's TensorRT-LLM server) is
    stopped on each of its nodes."""
    from orchestrator.commands import docker_cmd
    from orchestrator.engines.serverctl import node_cmd
    from orchestrator.phases.managed import managed_filter_args

    engine = str(running["engine"])
    if running.get("container") in (None, inventory.container.name):  # in the `up` container
        return node_cmd(inventory.container.name, action="stop", rotate=True)
    # engines with their own containers: the record's own containers only (the engine's
    # named servers run in others)
    ids = docker_cmd("ps", "-aq", *managed_filter_args(inventory), "--filter",
                     f"label=sparkctl.engine={engine}", "--filter",
                     f"name=^/{running['container']}$")
    pid_file = quote(f"{RUN_DIR}/{running.get('main') or 'server.pid'}")
    return (f"ids=$({ids}); [ -z \"$ids\" ] || {docker_cmd('rm', '-f')} $ids "
            f">/dev/null; rm -f {pid_file}")
