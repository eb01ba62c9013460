"""The phases of one TensorRT-LLM server's launch (serve.py has what they share).

server-check: every node's servers judged against this one (its name, port and memory:
engines/servers.py); a server of the same name launched by an earlier sparkctl (its single
record converted by node/servers.py's one-time migration) is stopped here and starts again as
configured now (said so). memory-check: what each serving node has now. stop-previous: a
server this launch restarts or replaces is stopped before the models are fetched (on unified
memory its weights would otherwise share the node with the copy). serve: the server's files, a
page-cache drop before a cold start, the memory guard, mpirun, readiness, smoke test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.commands import join, quote
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.engines import apikey, servers
from orchestrator.engines.serverctl import node_call
from orchestrator.engines.trtllm.serve import MAIN, OURS, LaunchSpec, node_plan, status_from_facts
from orchestrator.engines.verify import SmokeTest
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.phases.memory import DropCaches
from orchestrator.records import Server
from orchestrator.remote.container import ContainerCommands
from orchestrator.remote.fact_records import FileInfo


class Placement(Step):
    """Every node's servers against this one (from facts): its name, port and memory."""

    name = "placement"
    scope = "head"

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        spec = self.spec
        every = servers.from_facts(ctx.cluster_facts, alive_only=False)
        earlier = next((s for s in every if s.migrated and s.name == spec.name
                        and s.engine == spec.recipe.engine), None)
        running = [s for s in every if s.alive and s is not earlier]
        decision, same = servers.judge(spec.wanted(), running, spec.replace,
                                       spec.options.ignore_memory)
        if earlier is not None:  # one copy, started again as this launch configures it
            return Change(f"stop {spec.name}, launched by an earlier sparkctl (record "
                          f"{earlier.record.migrated_from}, moved to "
                          f"{servers.record_dir(spec.name)}): it starts again below as "
                          "configured now", payload=earlier)
        if decision == "replace" and same is not None:
            return Change(f"stop server {spec.name} ({', '.join(same.record.nodes)}, "
                          "another configuration): --replace", payload=same)
        moved = next((s for s in every if s.name == spec.name and not s.alive
                      and s.node != spec.first), None)
        if moved is not None:  # its record would stay there, dead, beside the new one
            return Change(f"remove what is left of {spec.name} on {moved.node} (not "
                          f"running; it starts again on {', '.join(spec.nodes)})", payload=moved)
        where = ", ".join(spec.nodes)
        if decision == "same":
            return Unchanged(f"{spec.name} already runs on {where} (config {spec.digest})")
        others = [s for s in running if s.name != spec.name]
        return Unchanged(f"{spec.name} fits on {where} ({spec.memory_gb:.1f} GB per node; "
                         f"{len(others)} other server(s) running)")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        server: Server = change.payload
        servers.stop_server(ctx.transports, ctx.inventory, server)
        if server.migrated:
            return (f"stopped {server.name}, launched by an earlier sparkctl: it starts again "
                    f"below in {self.spec.run_dir}")
        return f"stopped {server.name}"


class StopPrevious(Step):
    """On each serving node: what this server left running there, before a restart or start."""

    name = "stop-previous"

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        if ctx.node.name not in self.spec.nodes:
            return Unchanged("not a serving node")
        decision = self.spec.decision(ctx)
        if decision in ("noop", "loading"):
            return Unchanged("the same server keeps running")
        mine = status_from_facts(ctx.facts)
        left = sorted(name for name, info in (mine.get("pids") or {}).items() if info["alive"])
        if not left:
            return Unchanged("nothing running")
        why = f": restart, {self.spec.restart_reason(ctx)}" if decision == "restart" else ""
        return Change(f"stop {self.spec.name}'s processes ({', '.join(left)}){why}", payload=why)

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        answer = node_call(ctx.transport, self.spec.container,  # type: ignore[arg-type]
                           action="stop", rotate=True, run=self.spec.run_dir, ours=list(OURS))
        if answer.get("left"):
            raise SparkctlError(f"{ctx.node.name}: processes {answer['left']} survived SIGKILL")
        return f"stopped {', '.join(answer.get('stopped', [])) or 'nothing'}{change.payload or ''}"


class ServerFiles(Step):
    """The server's directory on each of its nodes: LLM API config, hostfile, processes.json."""

    name = "server-files"

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        if ctx.node.name not in self.spec.nodes:
            return Unchanged("not a serving node")
        stale = [path for path, text in self.spec.files().items()
                 if (ctx.facts.file(path) or FileInfo(exists=False)).content != text]
        if not stale:
            return Unchanged(f"{self.spec.run_dir}: config, hostfile and processes.json current")
        writes = [f"install -d -m 0755 {quote(self.spec.run_dir)}"]
        for path, text in self.spec.files().items():
            writes.append(f"printf '%s' {quote(text)} > {quote(path + '.tmp')} && "
                          f"mv -f {quote(path + '.tmp')} {quote(path)}")
        return Change(f"write {', '.join(p.rsplit('/', 1)[1] for p in stale)} in "
                      f"{self.spec.run_dir}", commands=(" && ".join(writes),))


class StartServer(Step):
    """mpirun in the first node's `up` container, then the record next to its pid file."""

    name = "server"
    scope = "head"

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        spec, decision = self.spec, self.spec.decision(ctx)
        if decision == "noop":
            return Unchanged(f"already serving {spec.name} (config {spec.digest}), /health 200")
        if decision == "loading":
            return Unchanged(f"{spec.name} (config {spec.digest}) is already starting")
        verb = {"replace": "replace the running server with",
                "restart": f"restart ({spec.restart_reason(ctx)})"}.get(decision, "start")
        return Change(f"{verb} {spec.recipe.model} as {spec.name} on {', '.join(spec.nodes)} "
                      f"(tp {spec.recipe.tp_size}) at {spec.host}:{spec.recipe.port}",
                      diff=join(spec.argv) + "\n", commands=(spec.start_cmd(),))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        spec = self.spec
        first = ctx.transports[spec.first]
        display = ContainerCommands(spec.container).shown(
            f"mpirun ... trtllm-serve {spec.recipe.model} on {spec.first}", detach=True)
        first.run(change.commands[0], timeout=60, display=display).check()
        answer = node_call(first, spec.container, action="started", run=spec.run_dir, main=MAIN,
                           server=spec.record())
        if not answer.get("alive"):
            raise SparkctlError(
                f"{spec.first}: mpirun exited at once; {spec.run_dir}/server.log ends with:\n"
                + "\n".join(answer.get("log", "").strip().splitlines()[-15:]))
        return (f"mpirun started on {spec.first} (pid {answer.get('pid')} in {spec.container}), "
                f"config {spec.digest}")


class Smoke(SmokeTest):
    """One real chat completion on the server's first node (where it answers)."""

    def __init__(self, ask: Callable[[Any], str], first: str) -> None:
        super().__init__(ask)
        self.first = first

    def runs_on(self, inventory: Inventory) -> str:
        return self.first

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        return self.ask(ctx.transports[self.first])


def cold_start_reason(spec: LaunchSpec) -> Callable[[NodeContext], str | None]:
    """Why a node needs no page-cache drop before this launch (None: it is a cold start)."""
    def reason(ctx: NodeContext) -> str | None:
        if ctx.node.name not in spec.nodes:
            return "not a serving node"
        if not spec.drop_caches:
            return "skipped (--no-drop-caches)"
        if spec.decision(ctx) in ("noop", "loading"):
            return "the server is already loaded"
        return None
    return reason


def status_facts(spec: LaunchSpec) -> Callable[[Inventory, Node], dict[str, Any]]:
    """Each serving node's view of the server's directory (its /health on the first node)."""
    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        if node.name not in spec.nodes:
            return {}
        port = spec.recipe.port if node.name == spec.first else None
        return {"commands": {"serve": spec.status_cmd(port)}}

    return facts


def check_phase(spec: LaunchSpec) -> Phase:
    from orchestrator.remote.facts import merge_requests

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        # probed: a server that was ready and answers no more is restarted
        return merge_requests([{"commands": {"servers": servers.servers_cmd(inv, node, probe=True)}},
                               status_facts(spec)(inv, node)])

    return Phase("server-check", [Placement(spec)], facts)


def memory_phase(spec: LaunchSpec) -> Phase:
    """Before any download: every serving node has the memory the recipe needs, right now."""
    from orchestrator.phases import memory
    from orchestrator.remote.facts import merge_requests

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        return merge_requests([memory.facts(inv, node), status_facts(spec)(inv, node)])

    return Phase("memory-check", [memory.MemoryPreflight(spec, node_plan(spec.recipe),
                                                         status_from_facts)], facts)


def stop_phase(spec: LaunchSpec) -> Phase:
    return Phase("stop-previous", [StopPrevious(spec)], status_facts(spec))


def serve_phase(spec: LaunchSpec, ready_steps: list[Step]) -> Phase:
    from orchestrator.phases.files import files_request
    from orchestrator.phases.memory import StartGuard
    from orchestrator.remote.facts import merge_requests

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        own = {"files": files_request(list(spec.files()))} if node.name in spec.nodes else {}
        # the key's node file where its relay runs (sha256 and mode, never the content)
        key = apikey.key_facts(spec.name) if spec.key is not None and node.name == spec.first else {}
        return merge_requests([own, key, status_facts(spec)(inv, node)])

    steps: list[Step] = [ServerFiles(spec), DropCaches(cold_start_reason(spec)),
                         StartGuard(spec, node_plan(spec.recipe), spec.recipe.name),
                         *([apikey.key_files_step(spec.name, [spec.first], spec.key)]
                           if spec.key is not None else []),
                         StartServer(spec), *ready_steps]
    return Phase("serve", steps, facts)
