"""`vllm serve` on the head, in its Ray container, over the Ray cluster; readiness over HTTP.

The server's record (server.json in RUN_DIR on the head) names the engine, the container and
the pid file, so status, chat, down and another engine's launch find it. A relaunch of the same
recipe is a no-op; a different one replaces it only with --replace. Readiness: /health, then
/v1/models naming the model (vLLM has no /health_generate), then one real chat completion.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from orchestrator.commands import docker_exec_cmd, join, quote
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.engines import config_hash, serving_nodes
from orchestrator.engines.base import LaunchFailed, Note, Ready
from orchestrator.engines.liveness import was_ready
from orchestrator.engines.trtllm.serve import node_call, node_cmd
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


def start_cmd(container: str, argv: list[str]) -> str:
    """Detached; the models are on every node already, so vLLM never goes online for them."""
    return docker_exec_cmd(container, ["bash", "-c", SERVER_WRAPPER, "sparkctl-server", *argv],
                           env={"HF_HUB_OFFLINE": "1"}, detach=True)


def status(transport: Transport, container: str, port: int | None = None, deep: bool = False,
           timeout: float = 120) -> dict[str, Any]:
    return node_call(transport, container, timeout=timeout, action="status", port=port,
                     deep=deep, generate=False, ours=OURS, main=MAIN)


def status_cmd(container: str, port: int | None) -> str:
    return node_cmd(container, action="status", port=port, ours=OURS, main=MAIN)


def running(status: dict[str, Any]) -> bool:
    return bool((status.get("pids") or {}).get(MAIN, {}).get("alive"))


def decide(status: dict[str, Any], digest: str, replace: bool) -> str:
    if not running(status):
        return "start"
    server = status.get("server") or {}
    if server.get("config_hash") == digest:
        if status.get("health") == 200:
            return "noop"
        # ready once and no answer now (a Ray worker or the fabric link was lost): stalled
        return "restart" if was_ready(server, bool(status.get("ready_log"))) else "loading"
    return "replace" if replace else "refuse"


def restart_reason(status: dict[str, Any]) -> str:
    ready = was_ready(status.get("server"), bool(status.get("ready_log")))
    return f"stalled: ready at {ready}, /health now {status.get('health') or 'no answer'}"


def refusal(status: dict[str, Any], recipe: Recipe) -> str:
    server = status.get("server") or {}
    return (f"the cluster already serves recipe {server.get('recipe', '?')} "
            f"({server.get('model', '?')}, engine {server.get('engine', 'vllm')}, started "
            f"{server.get('started', '?')}); launching {recipe.name} would replace it: pass "
            "--replace, or stop it first with `sparkctl down`")


class ServeSpec:
    def __init__(self, recipe: Recipe, inventory: Inventory, host: str, replace: bool) -> None:
        self.recipe, self.inventory, self.host, self.replace = recipe, inventory, host, replace
        from orchestrator.engines.vllm.ray import node_ip

        self.argv = serve_argv(recipe, host, 0, node_ip(inventory, inventory.head))
        self.digest = config_hash(recipe, self.argv, "")
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
        return {"engine": "vllm", "recipe": r.name, "model": r.model, "draft_model": None,
                "port": r.port, "host": self.host, "tp_size": r.tensor_parallel_size,
                "pp_size": r.pipeline_parallel_size, "container": r.container_name,
                "executor": r.backend,
                "main": MAIN, "ours": OURS, "nodes": self.serving,
                "started": datetime.now(UTC).isoformat(timespec="seconds"),
                "config_hash": self.digest}


class StopPrevious(Step):
    name = "stop-previous"
    scope = "head"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        current = self.spec.head_status(ctx)
        decision = decide(current, self.spec.digest, self.spec.replace)
        if decision == "refuse":
            raise SparkctlError(refusal(current, self.spec.recipe))
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
        decision = decide(current, self.spec.digest, self.spec.replace)
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
                      commands=(start_cmd(recipe.container_name, self.spec.argv),))

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


class ServerGuard(Step):
    """Before anything is fetched: a different vLLM server running is refused unless --replace
    (judged from the head's facts)."""

    name = "running-server"
    scope = "head"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        current = self.spec.head_status(ctx)
        decision = decide(current, self.spec.digest, self.spec.replace)
        if decision == "refuse":
            raise SparkctlError(refusal(current, self.spec.recipe))
        return Unchanged({"start": "no vLLM server runs", "replace": "--replace: replaced below",
                          "restart": f"{self.spec.recipe.name} runs but is "
                                     f"{restart_reason(current)}; restarted below"}
                         .get(decision, f"{self.spec.recipe.name} already runs here"))


def guard_facts(spec: ServeSpec) -> dict[str, Any]:
    return {"commands": {"serve": status_cmd(spec.recipe.container_name, spec.recipe.port)}}


def phase(spec: ServeSpec, ready_steps: list[Step] | None = None) -> Phase:
    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        if node.name != inv.head_name:
            return {}
        return {"commands": {"serve": status_cmd(spec.recipe.container_name, spec.recipe.port)}}

    from orchestrator.phases.models import ServingPhase

    return ServingPhase("serve", [StopPrevious(spec), StartServer(spec), *(ready_steps or [])],
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
