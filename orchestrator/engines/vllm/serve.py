"""One named vLLM server: its containers, ports, record, and `vllm serve` in its first node's
container.

A server is `sparkctl-vllm-<name>` on each of its nodes (its own Ray cluster, or its own mp
ranks), `vllm serve` started detached (`docker exec -d`) in the first node's container, its pid
file and log in RUN_DIR/servers/<name>/serve/ and its record in RUN_DIR/servers/<name>/server.json
on its first node (engines/servers.py: what status, chat, tunnel, down and a relaunch read).
Readiness: /health, then /v1/models naming the model (vLLM has no /health_generate), then one
real chat completion (engines/vllm/ready.py).
"""

from __future__ import annotations

from typing import Any

from orchestrator.commands import join, quote
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.engines import apikey, config_hash, recipe_origin, servers
from orchestrator.engines.lifecycle import ServerRecord, now
from orchestrator.engines.serverctl import node_call, node_cmd, pid_wrapper
from orchestrator.engines.serverspec import ServerSpec
from orchestrator.engines.vllm.guard import chain_name
from orchestrator.engines.vllm.ports import ServerPorts
from orchestrator.engines.vllm.recipe import Recipe
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.recipe import LaunchOptions
from orchestrator.records import Server
from orchestrator.remote.container import ContainerCommands

ENGINE = "vllm"
MAIN = "vllm.pid"
OURS = ["vllm"]
FIRST_IP = "<first node's fabric IP>"


def serve_dir(name: str) -> str:
    """vllm serve's pid file and log: beside the record, apart from the memory guard's pid file
    (server control stops what every pid file of its directory names)."""
    return f"{servers.record_dir(name)}/serve"


def serve_argv(recipe: Recipe, host: str, rank: int = 0, first_ip: str = FIRST_IP,
               master_port: int | None = None) -> list[str]:
    """`vllm serve` of one node: rank 0 serves the API (host, port); with the mp executor on
    several nodes every rank gets --nnodes/--node-rank/--master-addr/--master-port and the
    ranks > 0 run --headless (engines/vllm/images.py picks the executor)."""
    argv = ["vllm", "serve", recipe.model]
    if recipe.revision != "main":
        argv += ["--revision", recipe.revision]
    argv += ["--tensor-parallel-size", str(recipe.tensor_parallel_size)]
    if recipe.pipeline_parallel_size > 1:
        argv += ["--pipeline-parallel-size", str(recipe.pipeline_parallel_size)]
    argv += ["--distributed-executor-backend", recipe.backend]
    if recipe.backend == "mp" and recipe.node_count > 1:
        port = master_port if master_port is not None else ServerPorts.of(recipe).master
        argv += ["--nnodes", str(recipe.node_count), "--node-rank", str(rank),
                 "--master-addr", first_ip, "--master-port", str(port)]
    argv += ["--gpu-memory-utilization", f"{recipe.memory.kv_cache_fraction:g}"]
    argv += ["--headless"] if rank > 0 else ["--host", host, "--port", str(recipe.port)]
    return [*argv, *recipe.serve_args]


def start_cmd(container: str, directory: str, argv: list[str], key_file: str | None = None) -> str:
    """Detached; the models are on every node already, so vLLM never goes online for them.
    KEY_FILE: the wrapper sets VLLM_API_KEY from it (vLLM reads that variable when --api-key is
    not given: vllm/entrypoints/openai/api_server.py), so the key is in no argv or Env."""
    wrapper = ((apikey.env_from_file("VLLM_API_KEY", key_file) if key_file else "")
               + f"mkdir -p {quote(directory)}; "
               + pid_wrapper(quote(f"{directory}/{MAIN}"), quote(f"{directory}/server.log")))
    return ContainerCommands(container).exec_cmd(["bash", "-c", wrapper, "sparkctl-server", *argv],
                                         env={"HF_HUB_OFFLINE": "1"}, detach=True)


class ServeSpec(ServerSpec):
    """One launch of one vLLM server: its ports, executor, containers, record, judgement."""

    recipe: Recipe

    def __init__(self, recipe: Recipe, inventory: Inventory, options: LaunchOptions) -> None:
        from orchestrator.phases.memory import guard_threshold

        super().__init__(recipe, inventory, options, recipe.container_name + "-{name}")
        self.ports = ServerPorts.of(recipe)
        self.backend = recipe.backend
        self.argv = serve_argv(recipe, self.host, 0, self.node_ip(self.first), self.ports.master)
        # a new key restarts the server (a slow salted digest of it, never the key)
        keyed = ["api-key", apikey.key_digest(self.key, self.name)] if self.key is not None else []
        self.digest = config_hash(recipe, self.argv + keyed, self.name)
        self.guard_gb = guard_threshold(options.guard_min_available_gb, recipe)
        self.directory = serve_dir(self.name)

    def node_ip(self, name: str) -> str:
        """The fabric address Ray, NCCL and vLLM use for a node (the one the others reach it at)."""
        return self.inventory.mpi_address(self.inventory.node(name))

    def use_worker_slot(self, slot: int) -> None:
        """Ray's worker ports in SLOT (the placement step's pick: engines/vllm/check.py)."""
        self.ports = ServerPorts.of(self.recipe, slot)

    def is_first(self, node: Node) -> bool:
        return node.name == self.first

    def listen_ports(self) -> list[int]:
        return self.ports.bound(self.backend, len(self.nodes))

    def record(self, started: str | None = None) -> dict[str, Any]:
        r = self.recipe
        return ServerRecord(
            name=self.name, engine=ENGINE, recipe=r.name, model=r.model, port=r.port,
            nodes=self.nodes, config_hash=self.digest, host=self.host, started=started or now(),
            ranks=r.tensor_parallel_size * r.pipeline_parallel_size,
            persistent=self.options.persist, guard_min_available_gb=self.guard_gb,
            memory_gb=self.estimate.total_gb, container=self.container,
            extra={"tp_size": r.tensor_parallel_size, "pp_size": r.pipeline_parallel_size,
                   "executor": self.backend, "image": r.image, "main": MAIN, "ours": OURS,
                   "pid_file": f"{self.directory}/{MAIN}",
                   "listen_ports": self.ports.bound(self.backend, len(self.nodes)),
                   "ray_port": self.ports.ray if self.backend == "ray" else None,
                   # its firewall chain on every node, removed when it stops (engines/vllm/guard.py)
                   "port_guard": chain_name(self.name) if self.backend == "ray" else None,
                   **recipe_origin(r), **apikey.record_fields(self.name, self.key)}).to_dict()

    def mine(self, ctx: NodeContext, alive_only: bool = True) -> Server | None:
        """This server as the nodes' `servers` facts list it (an earlier sparkctl's single
        server of this name aside: the placement step replaces it)."""
        return next((s for s in servers.from_facts(ctx.cluster_facts, alive_only)
                     if s.name == self.name and not s.migrated), None)

    def runs(self, ctx: NodeContext) -> bool:
        """The same configuration already runs (serving or loading): nothing to start."""
        mine = self.mine(ctx)
        return mine is not None and mine.record.config_hash == self.digest

    def status(self, transport: Any, deep: bool = False, timeout: float = 120) -> dict[str, Any]:
        return node_call(transport, self.container, timeout=timeout, action="status",
                         port=self.recipe.port, deep=deep, generate=False, ours=OURS, main=MAIN,
                         run=self.directory)

    def stop_cmd(self, rotate: bool = True) -> str:
        """Stops vllm serve in the first node's container (the containers stay)."""
        return node_cmd(self.container, action="stop", rotate=rotate, ours=OURS,
                        run=self.directory)


def servers_facts(inventory: Inventory, node: Node) -> dict[str, Any]:
    """Every server on the node, probed (as the check phase asks: one command per key)."""
    return {"commands": {"servers": servers.servers_cmd(inventory, node, probe=True)}}


class StartServer(Step):
    """`vllm serve` in the first node's container, then the server's record beside it."""

    name = "server"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        spec, recipe = self.spec, self.spec.recipe
        if not spec.is_first(ctx.node):
            return Unchanged(f"{spec.name} answers on {spec.first}")
        if spec.runs(ctx):
            return Unchanged(f"already serving {spec.name} ({recipe.name}, config {spec.digest})")
        over = "over Ray" if spec.backend == "ray" else "(its own multi-node, no Ray)"
        return Change(f"start {recipe.model} as {spec.name} with vLLM {over} on "
                      f"{', '.join(spec.nodes)} (tp {recipe.tensor_parallel_size}, pp "
                      f"{recipe.pipeline_parallel_size}) at {spec.host}:{recipe.port}",
                      diff=join(spec.argv) + "\n",
                      commands=(start_cmd(spec.container, spec.directory, spec.argv, spec.key_file),))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        spec = self.spec
        shown = ContainerCommands(spec.container).shown(f"vllm serve {spec.recipe.model}", detach=True)
        ctx.run(change.commands[0], timeout=60, display=shown).check()
        answer = node_call(ctx.transport, spec.container, action="started",  # type: ignore[arg-type]
                           server=spec.record(), main=MAIN, ours=OURS, run=spec.directory)
        if not answer.get("alive"):
            raise SparkctlError(
                f"{ctx.node.name}: vllm serve exited at once; {spec.directory}/server.log ends "
                "with:\n" + "\n".join(answer.get("log", "").strip().splitlines()[-15:]))
        ctx.run(servers.record_cmd(spec.name, spec.record()), sudo=True, timeout=60,
                display=f"write {servers.record_dir(spec.name)}/server.json").check()
        return (f"vllm serve started (pid {answer.get('pid')} in {spec.container}), config "
                f"{spec.digest}; record {servers.record_dir(spec.name)}/server.json")


class Smoke(Step):
    """One real chat completion on the server's first node."""

    name = "smoke-test"
    kind = "verify"
    scope = "head"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def runs_on(self, inventory: Inventory) -> str:
        return self.spec.first

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        from orchestrator.engines.serverctl import smoke_test

        spec = self.spec
        return smoke_test(ctx.transports[spec.first], spec.container, spec.recipe.model,
                          spec.recipe.port, run=spec.directory)


def serve_phase(spec: ServeSpec, ready_steps: list[Step]) -> Phase:
    from orchestrator.phases.models import ServingPhase

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        if node.name != spec.first:
            return {}
        return {**servers_facts(inv, node),
                **(apikey.key_facts(spec.name) if spec.key is not None else {})}

    # the head too: the verify steps run there (they reach the first node over its transport)
    nodes = [spec.inventory.head_name, *(n for n in spec.nodes if n != spec.inventory.head_name)]
    key = [apikey.key_files_step(spec.name, [spec.first], spec.key)] if spec.key is not None else []
    return ServingPhase("serve", [*key, StartServer(spec), *ready_steps], facts, serving=nodes)
