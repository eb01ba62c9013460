"""Every server on the cluster, whichever engine runs it, and the rules for one more.

Every server has its directory RUN_DIR/servers/<name>/ on each of its nodes and its record
server.json there on its first node (the one it answers on). `orchestrator/node/servers.py`
lists them on a node (one command per node, so launch gathers it as a fact); on the head it
first converts, once, the single record RUN_DIR/server.json an earlier sparkctl kept for the
cluster's one server (docs/launch.md). Each answer is read once into typed records
(engines/records.py). A new server is judged against the live ones sharing a node with it: a
port already taken there is refused (named), and the sum of the recorded per-node memory
estimates plus the new one must fit in a Spark's unified memory (refused with the numbers,
unless --ignore-memory). Servers on other nodes are never in the way, whatever their engine.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.engines import DEFAULT_ENGINE, process_words, ready_lines
from orchestrator.errors import InputError, SparkctlError
from orchestrator.paths import RUN_DIR
from orchestrator.recipe import SPARK_MEMORY_GB
from orchestrator.records import Member, NodeAnswer, ProcessUse, Server, ServerRecord, read_server
from orchestrator.remote.gathered import NodeFacts

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.remote.transport import Transport

SERVERS_DIR = f"{RUN_DIR}/servers"


def record_dir(name: str) -> str:
    return f"{SERVERS_DIR}/{name}"


def servers_cmd(inventory: Inventory, node: Node | None = None, probe: bool = False) -> str:
    """The node's servers as JSON (on the head after the one-time migration of the older
    single record)."""
    from orchestrator.node import script

    head = node is None or node.name == inventory.head_name
    migrate = {"container": inventory.container.name, "engine": DEFAULT_ENGINE,
               "ours": process_words(), "nodes": [n.name for n in inventory.ordered_nodes()]}
    args = {"run": RUN_DIR, "probe": probe, "ready_lines": ready_lines(),
            "migrate": migrate if head else None, "serverctl": script("serverctl.py")}
    return "python3 -c " + quote(script("servers.py")) + " " + quote(json.dumps(args, sort_keys=True))


def parse(out: str, node: str) -> NodeAnswer:
    """NODE's answer, read once: RecordError names a damaged record (node, server, key)."""
    try:
        found = json.loads(out or "{}")
    except ValueError:
        return NodeAnswer()
    if not isinstance(found, dict):
        return NodeAnswer()
    listed = found.get("servers")
    servers = [read_server(record, node) for record in listed] if isinstance(listed, list) else []
    members = found.get("members")
    if not isinstance(members, dict):
        return NodeAnswer(servers)
    return NodeAnswer(servers, {str(name): m for name, data in members.items()
                                if (m := Member.read(data)) is not None})


def attach_members(servers: list[Server], by_node: dict[str, dict[str, Member]]) -> list[Server]:
    """Each named server's processes on every node it spans (what status shows: RSS, process);
    one whose container ended on another node (an rpc-server, a rank) is not alive: it cannot
    serve, whatever its first node's /health says."""
    out = []
    for server in servers:
        if server.migrated:  # its parts run in the earlier layout: judged on its first node
            out.append(server)
            continue
        processes: list[ProcessUse] = []
        gone: list[str] = []
        ended: list[str] = []
        guard = server.memguard
        for node in server.nodes:
            if node not in by_node:
                continue  # not asked (unreachable, or not part of this gathering)
            member = by_node[node].get(server.name)
            if member is not None and member.memguard and not guard:
                guard = member.memguard  # the guard that stopped it, on a member
            if member is None or not member.running:
                gone.append(node)
                ended += [f"{what} on {node}" for what in (member.ended if member else ())]
                continue
            processes.append(ProcessUse(node, member.process, round(member.rss_kb / 1024, 1)))
        dead = bool(gone) and server.alive
        out.append(replace(server, memguard=guard, processes=tuple(processes),
                           ended=tuple(ended),  # a process server's processes that ended
                           alive=server.alive and not gone,
                           dead_nodes=tuple(gone) if dead else ()))
    return out


def _collect(answers: dict[str, str], alive_only: bool) -> list[Server]:
    out: list[Server] = []
    by_node: dict[str, dict[str, Member]] = {}
    for node, text in sorted(answers.items()):
        answer = parse(text, node)
        if answer.members is not None:
            by_node[node] = answer.members
        out += answer.servers
    return [s for s in attach_members(out, by_node) if s.alive or not alive_only]


def from_facts(cluster_facts: dict[str, NodeFacts], alive_only: bool = True) -> list[Server]:
    """Every (live) server from each node's `servers` command fact."""
    return _collect({node: facts.output("servers") for node, facts in cluster_facts.items()},
                    alive_only)


def gather(transports: dict[str, Transport], inventory: Inventory, probe: bool = False,
           alive_only: bool = True) -> list[Server]:
    """Every server, asked of every reachable node in parallel (chat, tunnel, bench, status)."""
    from orchestrator.remote.cluster import parallel

    def one(name: str) -> str | None:
        result = transports[name].run(servers_cmd(inventory, inventory.node(name), probe),
                                      sudo=True, timeout=120, display="the servers on this node")
        return result.stdout if result.ok else None

    answers = {name: outcome.get() or "" for name, outcome in
               parallel(one, sorted(transports)).items()
               if outcome.ok and outcome.get() is not None}
    return _collect(answers, alive_only)


def pick(servers: list[Server], name: str | None) -> Server:
    """The server NAME, or the only one; several without a name: ask for --server."""
    if name:
        named = [s for s in servers if s.name == name]
        if named:
            return named[0]
        listing = ", ".join(sorted(s.name for s in servers)) or "none"
        raise InputError(f"no server named {name!r} runs (running: {listing})")  # --server
    if not servers:
        raise SparkctlError("no model server is running: start one with `sparkctl launch RECIPE`")
    if len(servers) > 1:
        listing = ", ".join(f"{s.name} ({s.engine} on {s.node}, port {s.record.port})"
                            for s in servers)
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


def memory_of(server: Server) -> float | None:
    """A running server's recorded per-node estimate; older records: its recipe's estimate."""
    if server.record.memory_gb is not None:
        return float(server.record.memory_gb)
    try:
        from orchestrator.engines import engine_of, load_recipe

        recipe = load_recipe(server.record.recipe)
        return float(engine_of(recipe).estimate_memory(recipe).total_gb)
    except (SparkctlError, OSError, ValueError):
        return None


def ports_of(server: Server) -> set[int]:
    record = server.record
    ports = {record.port} if record.port else set()
    if record.dist_port and len(record.nodes) > 1:
        ports.add(record.dist_port)
    # every other port the server binds, where its record lists them (vLLM's Ray ports)
    ports.update(record.listen_ports or [])
    return ports


def record_cmd(name: str, record: dict[str, Any]) -> str:
    """The node command that writes a server's record, RUN_DIR/servers/<name>/server.json
    (atomically: status and a relaunch never read half of it)."""
    path = f"{record_dir(name)}/server.json"
    text = json.dumps(record, indent=1, sort_keys=True)
    return (f"install -d -m 0755 {quote(record_dir(name))} && "
            f"printf '%s\\n' {quote(text)} > {quote(path + '.tmp')} && "
            f"mv -f {quote(path + '.tmp')} {quote(path)}")


def judge(wanted: Wanted, running: list[Server], replace: bool,
          ignore_memory: bool) -> tuple[str, Server | None]:
    """("start" | "same" | "replace", the server replaced) or SparkctlError naming why not."""
    same = next((s for s in running if s.name == wanted.name), None)
    others = [s for s in running if s is not same]
    decision: tuple[str, Server | None] = ("start", None)
    if same is not None:
        if same.record.config_hash == wanted.config_hash and same.engine == wanted.engine:
            decision = ("same", same)
        elif not replace:
            raise SparkctlError(
                f"a server named {wanted.name} already runs ({same.engine}, "
                f"{same.record.model} on {', '.join(same.record.nodes)}, started "
                f"{same.record.started}) with another configuration: pass --replace, give "
                f"this one another name (--name), or stop it (`sparkctl down --server {wanted.name}`)")
        else:
            decision = ("replace", same)
    for node in wanted.nodes:
        here = [s for s in others if node in s.record.nodes]
        for other in here:
            taken = ports_of(other) & set(wanted.ports)
            if taken:
                port = sorted(taken)[0]
                raise SparkctlError(
                    f"port {port} on {node} is taken by server {other.name} "
                    f"({other.engine}, {other.record.model}): launch with another --port "
                    f"or stop it first (`sparkctl down --server {other.name}`)")
        if ignore_memory or not here:
            continue
        used = [(o.name, memory_of(o)) for o in here]
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


def stop_commands(server: Server, inventory: Inventory) -> dict[str, str]:
    """Per node, the command that stops one server and removes its record."""
    from orchestrator.commands import docker_cmd

    name = server.name
    labelled = docker_cmd("ps", "-aq", "--filter", "label=sparkctl.managed=true", "--filter",
                          f"label=sparkctl.cluster={inventory.cluster.name}", "--filter",
                          f"label=sparkctl.server={name}")
    ids = f"$({labelled})"
    if server.migrated and server.record.container != inventory.container.name:
        # an earlier sparkctl's containers had no server label: the record names them
        from orchestrator.phases.managed import managed_filter_args

        named = docker_cmd("ps", "-aq", *managed_filter_args(inventory), "--filter",
                           f"name=^/{server.record.container}$")
        ids = f"$({labelled}; {named})"
    remove = (f"ids={ids}; [ -z \"$ids\" ] || {docker_cmd('rm', '-f')} $ids >/dev/null; "
              f"rm -rf -- {quote(record_dir(name))}")
    if server.record.main:  # processes in a shared container: stopped by their pid files there
        from orchestrator.engines.serverctl import node_cmd

        stop = node_cmd(server.record.container or inventory.container.name, action="stop",
                        run=record_dir(name), ours=server.record.ours)
        remove = f"{{ {stop} >/dev/null 2>&1 || true; }}; {remove}"
    if server.record.port_guard:  # its firewall chain (phases/port_guards.py) goes with it
        from orchestrator.phases.port_guards import remove_cmd

        remove += f" && {remove_cmd(server.record.port_guard)} >/dev/null"
    return {node: remove for node in server.nodes}


def unrecorded(name: str, engine: str, nodes: Sequence[str]) -> Server:
    """A server that has no record yet (its start failed half-way): what stopping it needs."""
    return Server(ServerRecord(name=name, engine=engine, recipe=name, model="?", port=0,
                               nodes=list(nodes), config_hash=""), nodes[0])


def stop_server(transports: dict[str, Any], inventory: Inventory, server: Server) -> None:
    for node, command in stop_commands(server, inventory).items():
        if node in transports:
            transports[node].run(command, sudo=True, timeout=120,
                                 display=f"stop server {server.name} on {node}").check()


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
        found = [s for s in from_facts(ctx.cluster_facts, alive_only=False)
                 if s.name == self.server]
        if not found:
            listing = ", ".join(sorted({s.name for s in from_facts(ctx.cluster_facts)})) or "none"
            raise SparkctlError(f"no server named {self.server!r} (running: {listing})")
        server = found[0]
        command = stop_commands(server, ctx.inventory).get(ctx.node.name)
        if command is None:
            return Unchanged(f"{self.server} does not run here")
        guard = server.record.port_guard
        gone = "its record" + (f" and its port guard (firewall chain {guard})" if guard else "")
        return Change(f"stop {self.server} ({server.engine}, {server.record.model}) and "
                      f"remove {gone}", commands=(command,))
