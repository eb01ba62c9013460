"""The model server: extra LLM API config, `mpirun ... trtllm-serve` started detached on the head.

A relaunch of the same recipe is a no-op (server.json's config hash matches and /health is 200);
a different recipe replaces the running one only with --replace. What runs is recorded on the
nodes (server.json on the head, a pid file per process), so stopping kills exactly what sparkctl
started. Readiness is judged over HTTP on the head afterwards (steps/readiness.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import yaml

from orchestrator.commands import Secret, docker_exec_cmd, join
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.engines import apikey, config_hash, lifecycle, serving_nodes
from orchestrator.engines.lifecycle import Decision, Running, ServerRecord
from orchestrator.engines.liveness import dead_ranks as ranks_ended
from orchestrator.engines.serverctl import node_call, node_cmd
from orchestrator.engines.trtllm.recipe import Recipe
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import RUN_DIR
from orchestrator.phases.files import FileSpec, ManagedFiles, files_request
from orchestrator.phases.memory import DropCaches
from orchestrator.render import render

CONFIG_PATH = "/etc/sparkctl/extra-llm-api-config.yml"
# Forwarded to every rank besides the fabric's variables (phases/nccl_env.fabric_variable_names).
FABRIC_ENV = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "UCX_NET_DEVICES")
PASSED_ENV = ("CPATH", "TRITON_PTXAS_PATH")
RANK_WRAPPER = (
    'r="${OMPI_COMM_WORLD_RANK:-0}"; echo $$ > ' + RUN_DIR + '/rank-"$r".pid; '
    'exec "$@" > ' + RUN_DIR + '/rank-"$r".log 2>&1'
)
SERVER_WRAPPER = (
    f"echo $$ > {RUN_DIR}/mpirun.pid; exec \"$@\" > {RUN_DIR}/server.log 2>&1"
)

def render_llm_api_config(recipe: Recipe) -> str:
    options = yaml.safe_dump(recipe.llm_api_config(), sort_keys=False, default_flow_style=False)
    return render("trtllm/templates/extra-llm-api-config.yml.j2", recipe=recipe.name,
                  options=options.rstrip())


def rank_wrapper(bootstrap: Sequence[str] | None) -> str:
    """RANK_WRAPPER, in a ring preceded by each rank's own NCCL_SOCKET_IFNAME (exact name, `=`):
    -x forwards the head's value to every rank, but a ring's bootstrap interface differs per node
    (phases/nccl_env.bootstrap_interfaces)."""
    if not bootstrap:
        return RANK_WRAPPER
    cases = " ".join(f"{rank}) export NCCL_SOCKET_IFNAME=={name};;"
                     for rank, name in enumerate(bootstrap))
    return f'case "${{OMPI_COMM_WORLD_RANK:-0}}" in {cases} esac; ' + RANK_WRAPPER


def serve_argv(recipe: Recipe, host: str, fabric: Sequence[str] = FABRIC_ENV,
               bootstrap: Sequence[str] | None = None) -> list[str]:
    """mpirun across the serving nodes; each rank's output in its own node's rank-N.log. `fabric`
    names the container's NCCL/UCX variables (a ring adds three): remote ranks start through the
    container's sshd with none of the container's environment, so each is forwarded (-x).
    `bootstrap`: per rank, a ring's NCCL bootstrap interface."""
    passed = ["HF_HUB_OFFLINE=1", *fabric, *PASSED_ENV]
    if not recipe.memory.parallel_weight_loading:
        passed.append("TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=1")
    argv = ["mpirun", "-np", str(recipe.node_count)]
    for name in passed:
        argv += ["-x", name]
    argv += ["bash", "-c", rank_wrapper(bootstrap), "sparkctl-rank",
             "trtllm-llmapi-launch", "trtllm-serve", recipe.model,
             "--backend", recipe.backend, "--tp_size", str(recipe.tp_size)]
    if recipe.max_num_tokens:
        argv += ["--max_num_tokens", str(recipe.max_num_tokens)]
    argv += ["--extra_llm_api_options", CONFIG_PATH, "--port", str(recipe.port), "--host", host,
             *recipe.serve_args]
    return argv


def start_cmd(container: str, argv: list[str], relay: str = "") -> str:
    """Detached (docker exec -d), mpirun's own output in server.log, its pid in mpirun.pid;
    RELAY: the key-checking relay's start (keyrelay.relay_prefix) when the server has a key."""
    return docker_exec_cmd(container, ["bash", "-c", relay + SERVER_WRAPPER, "sparkctl-server",
                                       *argv], env={"HF_HUB_OFFLINE": "1"}, detach=True)


MAIN = "mpirun.pid"


def server_record(recipe: Recipe, host: str, digest: str, name: str | None = None,
                  nodes: list[str] | None = None, guard_gb: float | None = None,
                  persistent: bool = False) -> dict[str, Any]:
    from orchestrator.engines.trtllm.recipe import estimate_memory

    draft = recipe.speculative.draft_model if recipe.speculative else None
    return ServerRecord(
        name=name or recipe.name, engine=recipe.engine, recipe=recipe.name, model=recipe.model,
        port=recipe.port, nodes=list(nodes or []), config_hash=digest, host=host, ranks=recipe.tp_size,
        guard_min_available_gb=guard_gb, persistent=persistent,
        memory_gb=estimate_memory(recipe).total_gb,
        extra={"draft_model": draft, "tp_size": recipe.tp_size,
               "memory_gb_per_node": estimate_memory(recipe).total_gb}).to_dict()


def decide(status: dict[str, Any], digest: str, replace: bool,
           dead_ranks: tuple[str, ...] = ()) -> Decision:
    """The shared judgement (engines/lifecycle.py) over the head's status and the ranks that
    ended on any node."""
    return lifecycle.decide(Running.from_status(status, MAIN), digest, replace, dead_ranks)


def restart_reason(status: dict[str, Any], dead: tuple[str, ...]) -> str:
    return lifecycle.restart_reason(Running.from_status(status, MAIN), dead)


def dead_ranks(cluster_facts: dict[str, dict[str, Any]], nodes: list[str]) -> tuple[str, ...]:
    """Recorded rank processes that have ended on these nodes (liveness.dead_ranks' words, as
    status says them too)."""
    return tuple(ranks_ended({node: status_from_facts(cluster_facts.get(node, {})).get("pids")
                              or {} for node in nodes}))


class LaunchSpec:
    """Everything the serve steps share, computed once (pure)."""

    def __init__(self, recipe: Recipe, inventory: Inventory, host: str, replace: bool,
                 drop_caches: bool, guard_min_available_gb: float | None = None,
                 name: str | None = None, persistent: bool = False,
                 key: Secret | None = None) -> None:
        from orchestrator.phases.memory import guard_threshold

        self.recipe = recipe
        self.guard_min_available_gb = guard_threshold(guard_min_available_gb, recipe)
        self.inventory = inventory
        self.host = host
        self.replace = replace
        self.drop_caches = drop_caches
        self.config_text = render_llm_api_config(recipe)
        from orchestrator.phases.nccl_env import bootstrap_interfaces, fabric_variable_names

        self.serving = serving_nodes(recipe, inventory)
        self.argv = serve_argv(recipe, host, fabric_variable_names(inventory),
                               bootstrap_interfaces(inventory, self.serving))
        self.name = name or recipe.name
        self.persistent = persistent
        self.key, self.relay = key, ""
        if key is not None:  # trtllm-serve takes no key: the relay binds host:port instead
            from orchestrator.engines.trtllm import keyrelay

            self.argv = keyrelay.behind_relay(self.argv, recipe.port)
            self.relay = keyrelay.relay_prefix(host, recipe.port, apikey.node_key_file(self.name))
        keyed = ["api-key", apikey.key_digest(key, self.name)] if key is not None else []
        self.digest = config_hash(recipe, self.argv + keyed, self.config_text)

    def record(self) -> dict[str, Any]:
        return {**server_record(self.recipe, self.host, self.digest, self.name, self.serving,
                                self.guard_min_available_gb, self.persistent),
                **apikey.record_fields(self.name, self.key)}

    def decision(self, ctx: NodeContext) -> Decision:
        head = ctx.cluster_facts.get(self.inventory.head_name, {})
        dead = dead_ranks(ctx.cluster_facts, sorted(self.serving))
        decision = decide(status_from_facts(head), self.digest, self.replace, dead)
        if decision == "refuse":
            raise SparkctlError(lifecycle.refusal(Running.from_status(status_from_facts(head), MAIN),
                                                  self.recipe.name))
        return decision

    def guard(self) -> lifecycle.ServerGuard:
        """The launch's first step: a different server of this engine refused, unless --replace."""
        return lifecycle.ServerGuard(self.recipe.name, "TensorRT-LLM", self.running, self.decision)

    def running(self, ctx: NodeContext) -> Running:
        head = ctx.cluster_facts.get(self.inventory.head_name, {})
        return Running.from_status(status_from_facts(head), MAIN)


def status_from_facts(facts: dict[str, Any]) -> dict[str, Any]:
    answer = facts.get("commands", {}).get("serve", {})
    if answer.get("rc") != 0:
        return {"error": answer.get("err", "")[-300:]}
    return dict(json.loads(answer["out"]))


class StopPrevious(Step):
    name = "stop-previous"

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        decision = self.spec.decision(ctx)
        if decision in ("noop", "loading"):
            return Unchanged("the same server keeps running")
        mine = status_from_facts(ctx.facts)
        running = sorted(name for name, info in (mine.get("pids") or {}).items() if info["alive"])
        if not running:
            return Unchanged("nothing running")
        why = ""
        if decision == "restart":
            head = status_from_facts(ctx.cluster_facts.get(self.spec.inventory.head_name, {}))
            why = ": restart, " + restart_reason(
                head, dead_ranks(ctx.cluster_facts, sorted(self.spec.serving)))
        return Change(f"stop the running server processes ({', '.join(running)}){why}",
                      payload=why)

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        answer = node_call(ctx.transport, ctx.inventory.container.name,  # type: ignore[arg-type]
                           action="stop", rotate=True)
        if answer.get("left"):
            raise SparkctlError(f"{ctx.node.name}: processes {answer['left']} survived SIGKILL")
        return f"stopped {', '.join(answer.get('stopped', [])) or 'nothing'}{change.payload or ''}"


def cold_start_reason(spec: LaunchSpec) -> Callable[[NodeContext], str | None]:
    """Why a node needs no page-cache drop before this launch (None: it is a cold start)."""
    def reason(ctx: NodeContext) -> str | None:
        if ctx.node.name not in spec.serving:
            return "not a serving node"
        if not spec.drop_caches:
            return "skipped (--no-drop-caches)"
        if spec.decision(ctx) in ("noop", "loading"):
            return "the server is already loaded"
        return None
    return reason


class StartServer(Step):
    name = "server"
    scope = "head"

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        decision = self.spec.decision(ctx)
        recipe = self.spec.recipe
        if decision == "noop":
            return Unchanged(f"already serving {recipe.name} (config {self.spec.digest}), /health 200")
        if decision == "loading":
            return Unchanged(f"{recipe.name} (config {self.spec.digest}) is already starting")
        head = status_from_facts(ctx.cluster_facts.get(self.spec.inventory.head_name, {}))
        reason = restart_reason(head, dead_ranks(ctx.cluster_facts, sorted(self.spec.serving)))
        verb = {"replace": "replace the running server with",
                "restart": f"restart ({reason})"}.get(decision, "start")
        return Change(
            f"{verb} {recipe.model} on {len(self.spec.serving)} node(s) (tp {recipe.tp_size}) at "
            f"{self.spec.host}:{recipe.port}",
            diff=join(self.spec.argv) + "\n",
            commands=(start_cmd(self.spec.inventory.container.name, self.spec.argv,
                                self.spec.relay),),
        )

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        container = ctx.inventory.container.name
        display = f"docker exec -d {container} mpirun ... trtllm-serve {self.spec.recipe.model}"
        ctx.run(change.commands[0], timeout=60, display=display).check()
        record = self.spec.record()
        answer = node_call(ctx.transport, container, action="started", server=record)  # type: ignore[arg-type]
        if not answer.get("alive"):
            raise SparkctlError(
                f"{ctx.node.name}: mpirun exited at once; {RUN_DIR}/server.log ends with:\n"
                + "\n".join(answer.get("log", "").strip().splitlines()[-15:])
            )
        return f"mpirun started (pid {answer.get('pid')} in {container}), config {self.spec.digest}"


def guard_facts(spec: LaunchSpec) -> dict[str, Any]:
    """What ServerGuard reads on the head (the same request the serve phase makes there)."""
    return {"commands": {"serve": node_cmd(spec.inventory.container.name, action="status",
                                           port=spec.recipe.port)}}


def node_plan(recipe: Recipe) -> Any:
    """What one serving node holds (the memory preflight's and the guard's figures)."""
    from orchestrator.engines.trtllm.recipe import estimate_memory
    from orchestrator.phases.memory import NodePlan

    estimate = estimate_memory(recipe)
    return NodePlan(weights_gb=estimate.weights_gb, draft_gb=estimate.draft_gb,
                    runtime_gb=estimate.runtime_gb, kv_cache_fraction=recipe.memory.kv_cache_fraction,
                    tp_size=recipe.tp_size, total_weights_gb=recipe.memory.weights_gb)


def memory_phase(spec: LaunchSpec) -> Phase:
    """Before any download: every serving node has the memory the recipe needs, right now."""
    from orchestrator.phases import memory

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        port = spec.recipe.port if node.name == inv.head_name else None
        return {**memory.facts(inv, node),
                "commands": {"serve": node_cmd(inv.container.name, action="status", port=port)}}

    return Phase("memory-check", [memory.MemoryPreflight(spec, node_plan(spec.recipe),
                                                         status_from_facts)], facts)


def serve_facts(spec: LaunchSpec) -> Any:
    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        port = spec.recipe.port if node.name == inv.head_name else None
        return {
            "files": {**files_request([CONFIG_PATH]),
                      **(apikey.key_facts(spec.name)["files"] if spec.key is not None else {})},
            "commands": {"serve": node_cmd(inv.container.name, action="status", port=port)},
        }

    return facts


def stop_phase(spec: LaunchSpec) -> Phase:
    """A server this launch replaces (or restarts) is stopped BEFORE the new model is fetched
    and copied: on unified memory the old server's weights and KV cache would otherwise share
    the node with the copy (seen in the lab: the copy's receiver OOM-killed in the node's
    memory cgroup)."""
    return Phase("stop-previous", [StopPrevious(spec)], serve_facts(spec))


def phase(spec: LaunchSpec, ready_steps: list[Step] | None = None) -> Phase:
    facts = serve_facts(spec)

    def config_files(ctx: NodeContext) -> list[FileSpec]:
        if ctx.node.name not in spec.serving:
            return []
        return [FileSpec(CONFIG_PATH, 0o644, spec.config_text)]

    from orchestrator.phases.memory import StartGuard

    steps: list[Step] = [ManagedFiles("llm-api-config", config_files),
                         DropCaches(cold_start_reason(spec)),
                         StartGuard(spec, node_plan(spec.recipe), spec.recipe.name),
                         *([apikey.key_files_step(spec.name, [spec.inventory.head_name], spec.key)]
                           if spec.key is not None else []),
                         StartServer(spec), *(ready_steps or [])]
    return Phase("serve", steps, facts)
