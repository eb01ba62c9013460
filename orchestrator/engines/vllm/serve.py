"""`vllm serve` on the head, in its Ray container, over the Ray cluster; readiness over HTTP.

The server's record (server.json in RUN_DIR on the head) names the engine, the container and
the pid file, so status, chat, down and another engine's launch find it. A relaunch of the same
recipe is a no-op; a different one replaces it only with --replace. Readiness: /health, then
/v1/models naming the model (vLLM has no /health_generate), then one real chat completion.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.commands import Secret, docker_exec_cmd, join, quote
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.engines import apikey, config_hash, lifecycle, serving_nodes
from orchestrator.engines.base import LaunchFailed, Note, Ready
from orchestrator.engines.lifecycle import Decision, Running, ServerRecord
from orchestrator.engines.serverctl import node_call, node_cmd
from orchestrator.engines.vllm.ray import ray_log_tail
from orchestrator.engines.vllm.recipe import Recipe
from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import RUN_DIR
from orchestrator.remote.transport import Transport

MAIN = "vllm.pid"
OURS = ["vllm"]
SERVER_WRAPPER = f"echo $$ > {RUN_DIR}/{MAIN}; exec \"$@\" > {RUN_DIR}/server.log 2>&1"
POLL_SECONDS = 3.0


def serve_argv(recipe: Recipe, host: str, rank: int = 0, head_ip: str = "<head fabric IP>") -> list[str]:
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
        argv += ["--nnodes", str(recipe.node_count), "--node-rank", str(rank),
                 "--master-addr", head_ip, "--master-port", str(recipe.master_port)]
    argv += ["--gpu-memory-utilization", f"{recipe.memory.kv_cache_fraction:g}"]
    argv += ["--headless"] if rank > 0 else ["--host", host, "--port", str(recipe.port)]
    return [*argv, *recipe.serve_args]


def start_cmd(container: str, argv: list[str], key_file: str | None = None) -> str:
    """Detached; the models are on every node already, so vLLM never goes online for them.
    KEY_FILE: the wrapper sets VLLM_API_KEY from it (vLLM reads that variable when --api-key is
    not given: vllm/entrypoints/openai/api_server.py), so the key is in no argv or Env."""
    wrapper = (apikey.env_from_file("VLLM_API_KEY", key_file) if key_file else "") + SERVER_WRAPPER
    return docker_exec_cmd(container, ["bash", "-c", wrapper, "sparkctl-server", *argv],
                           env={"HF_HUB_OFFLINE": "1"}, detach=True)


def status(transport: Transport, container: str, port: int | None = None, deep: bool = False,
           timeout: float = 120) -> dict[str, Any]:
    return node_call(transport, container, timeout=timeout, action="status", port=port,
                     deep=deep, generate=False, ours=OURS, main=MAIN)


def status_cmd(container: str, port: int | None) -> str:
    return node_cmd(container, action="status", port=port, ours=OURS, main=MAIN)


def running(status: dict[str, Any]) -> bool:
    return bool((status.get("pids") or {}).get(MAIN, {}).get("alive"))


def decide(status: dict[str, Any], digest: str, replace: bool) -> Decision:
    """The shared judgement (engines/lifecycle.py) over the head's status."""
    return lifecycle.decide(Running.from_status(status, MAIN), digest, replace)


def restart_reason(status: dict[str, Any]) -> str:
    return lifecycle.restart_reason(Running.from_status(status, MAIN))


class ServeSpec:
    def __init__(self, recipe: Recipe, inventory: Inventory, host: str, replace: bool,
                 name: str | None = None, guard_gb: float | None = None,
                 persistent: bool = False, key: Secret | None = None) -> None:
        self.recipe, self.inventory, self.host, self.replace = recipe, inventory, host, replace
        self.name, self.guard_gb, self.persistent = name or recipe.name, guard_gb, persistent
        from orchestrator.engines.vllm.ray import node_ip

        self.argv = serve_argv(recipe, host, 0, node_ip(inventory, inventory.head))
        self.key = key
        self.key_file = apikey.node_key_file(self.name) if key is not None else None
        # a new key restarts the server (a slow salted digest of it, never the key)
        keyed = ["api-key", apikey.key_digest(key, self.name)] if key is not None else []
        self.digest = config_hash(recipe, self.argv + keyed, "")
        self.serving = serving_nodes(recipe, inventory)

    def head_status(self, ctx: NodeContext) -> dict[str, Any]:
        import json

        head = ctx.cluster_facts.get(self.inventory.head_name, {})
        answer = (head.get("commands") or {}).get("serve") or {}
        if answer.get("rc") != 0:
            return {"error": (answer.get("err") or "")[-300:]}
        return dict(json.loads(answer["out"]))

    def record(self) -> dict[str, Any]:
        r = self.recipe
        return ServerRecord(
            name=self.name, engine="vllm", recipe=r.name, model=r.model, port=r.port,
            nodes=self.serving, config_hash=self.digest, host=self.host,
            ranks=r.tensor_parallel_size * r.pipeline_parallel_size, persistent=self.persistent,
            guard_min_available_gb=self.guard_gb, container=r.container_name,
            extra={"draft_model": None, "tp_size": r.tensor_parallel_size,
                   "pp_size": r.pipeline_parallel_size, "executor": r.backend, "main": MAIN,
                   "ours": OURS, **apikey.record_fields(self.name, self.key)}).to_dict()

    def guard(self) -> lifecycle.ServerGuard:
        """The launch's first step: a different server of this engine refused, unless --replace."""
        return lifecycle.ServerGuard(self.recipe.name, "vLLM", self.running, self.decision)

    def running(self, ctx: NodeContext) -> Running:
        return Running.from_status(self.head_status(ctx), MAIN)

    def decision(self, ctx: NodeContext) -> Decision:
        decision = decide(self.head_status(ctx), self.digest, self.replace)
        if decision == "refuse":
            raise SparkctlError(lifecycle.refusal(self.running(ctx), self.recipe.name))
        return decision


class StopPrevious(Step):
    name = "stop-previous"
    scope = "head"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        current = self.spec.head_status(ctx)
        decision = self.spec.decision(ctx)
        if decision in ("noop", "loading", "start"):
            return Unchanged("nothing to stop" if decision == "start" else "the same server keeps running")
        why = f": restart, {restart_reason(current)}" if decision == "restart" else ""
        return Change(f"stop vllm serve ({(current.get('server') or {}).get('recipe', '?')}){why}",
                      payload=why)

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        answer = node_call(ctx.transport, self.spec.recipe.container_name,  # type: ignore[arg-type]
                           action="stop", rotate=True, ours=OURS)
        if answer.get("left"):
            raise SparkctlError(f"{ctx.node.name}: processes {answer['left']} survived SIGKILL")
        return f"stopped {', '.join(answer.get('stopped', [])) or 'nothing'}{change.payload or ''}"


class StartServer(Step):
    name = "server"
    scope = "head"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        current = self.spec.head_status(ctx)
        decision = self.spec.decision(ctx)
        recipe = self.spec.recipe
        if decision == "noop":
            return Unchanged(f"already serving {recipe.name} (config {self.spec.digest}), /health 200")
        if decision == "loading":
            return Unchanged(f"{recipe.name} (config {self.spec.digest}) is already starting")
        verb = {"replace": "replace the running server with",
                "restart": f"restart ({restart_reason(current)})"}.get(decision, "start")
        over = "over Ray" if recipe.backend == "ray" else "(its own multi-node, no Ray)"
        return Change(f"{verb} {recipe.model} with vLLM {over} on {len(self.spec.serving)} "
                      f"node(s) (tp {recipe.tensor_parallel_size}, pp "
                      f"{recipe.pipeline_parallel_size}) at {self.spec.host}:{recipe.port}",
                      diff=join(self.spec.argv) + "\n",
                      commands=(start_cmd(recipe.container_name, self.spec.argv,
                                          self.spec.key_file),))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        container = self.spec.recipe.container_name
        ctx.run(change.commands[0], timeout=60,
                display=f"docker exec -d {container} vllm serve {self.spec.recipe.model}").check()
        answer = node_call(ctx.transport, container, action="started",  # type: ignore[arg-type]
                           server=self.spec.record(), main=MAIN, ours=OURS)
        if not answer.get("alive"):
            raise SparkctlError(
                f"{ctx.node.name}: vllm serve exited at once; {RUN_DIR}/server.log ends with:\n"
                + "\n".join(answer.get("log", "").strip().splitlines()[-15:]))
        return f"vllm serve started (pid {answer.get('pid')} in {container}), config {self.spec.digest}"


def guard_facts(spec: ServeSpec) -> dict[str, Any]:
    return {"commands": {"serve": status_cmd(spec.recipe.container_name, spec.recipe.port)}}


def phase(spec: ServeSpec, ready_steps: list[Step] | None = None) -> Phase:
    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        if node.name != inv.head_name:
            return {}
        own = {"commands": {"serve": status_cmd(spec.recipe.container_name, spec.recipe.port)}}
        return {**own, **(apikey.key_facts(spec.name) if spec.key is not None else {})}

    from orchestrator.phases.models import ServingPhase

    key = [apikey.key_files_step(spec.name, [spec.inventory.head_name], spec.key)] if spec.key else []
    return ServingPhase("serve", [StopPrevious(spec), *key, StartServer(spec), *(ready_steps or [])],
                        facts, serving=[spec.inventory.head_name])


# ------------------------------------------------------------------ readiness
def wait_until_ready(transports: dict[str, Transport], recipe: Recipe, inventory: Inventory,
                     timeout: float, note: Note) -> Ready:
    head = transports[inventory.head_name]
    container = recipe.container_name
    started = time.monotonic()
    deadline = started + timeout
    last = ""
    try:
        while True:
            current = status(head, container, port=recipe.port, deep=True)
            elapsed = time.monotonic() - started
            if not running(current):
                fail_and_clean(transports, recipe, inventory, note,
                               f"vllm serve exited while loading (after {elapsed:.0f}s)")
            models = [m for m in current.get("models") or [] if m]
            if current.get("health") == 200 and recipe.model in models:
                note(f"[{elapsed:6.1f}s] ready: /health and /v1/models answer")
                return Ready(elapsed, models)
            if time.monotonic() > deadline:
                fail_and_clean(transports, recipe, inventory, note,
                               f"vllm serve was not ready within {timeout:.0f}s (--timeout)")
            stage = f"loading (/health {current.get('health') or 'no answer'})"
            if stage != last:
                note(f"[{elapsed:6.1f}s] {stage}; deadline in {deadline - time.monotonic():.0f}s")
                last = stage
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        raise SparkctlError(
            f"stopped waiting; vLLM keeps loading on {inventory.head_name}. Follow it with "
            "`sparkctl logs --follow` or `sparkctl status`; stop it with `sparkctl down`",
            EXIT_INTERRUPTED) from None


def fail_and_clean(transports: dict[str, Transport], recipe: Recipe, inventory: Inventory,
                   note: Note, reason: str) -> None:
    head = transports[inventory.head_name]
    log = head.run(f"tail -n 30 {quote(RUN_DIR + '/server.log')} 2>/dev/null; true", sudo=True,
                   timeout=60, display="tail server.log").stdout.strip()
    parts = [f"--- {inventory.head_name}: last lines of {RUN_DIR}/server.log\n{log or '(empty)'}"]
    for name in serving_nodes(recipe, inventory):
        if name in transports:
            parts.append(f"--- {name}: Ray ({recipe.container_name})\n"
                         + ray_log_tail(transports[name], recipe.container_name, 8))
    note(f"{reason}; stopping vllm serve")
    left = ""
    try:
        answer = node_call(head, recipe.container_name, action="stop", ours=OURS)
        left = f" NOT stopped: {answer['left']}" if answer.get("left") else ""
    except SparkctlError as exc:
        left = f" could not stop it: {exc}"
    raise LaunchFailed(f"{reason}; vllm serve stopped{left} (log tails below)", "\n".join(parts))
