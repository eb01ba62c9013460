"""vLLM across Sparks: per serving node a container of the recipe's vLLM image, and `vllm serve`
started in the head's. Where the image ships Ray (or the recipe says `executor: ray`) the
containers run a Ray node (the head's bound to its fabric address, the workers joining it over
the fabric) and vLLM uses `--distributed-executor-backend ray`; else vLLM's own multi-node
(`mp`: --nnodes/--node-rank/--master-addr/--master-port, the other nodes' containers run their
`--headless` rank). engines/vllm/images.py decides, engines/vllm/multinode.py builds the phase.

`up` adds nothing (the TensorRT-LLM container stays the cluster's tool for fetching and copying
models); `launch` fetches the models (shared phase), starts the Ray containers, waits until Ray
reports every serving node, then starts vLLM; readiness is /health, /v1/models and one real
chat completion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.engines.apikey import KeyWay
from orchestrator.engines.base import SPARK_MEMORY_GB, LaunchOptions, MemoryEstimate, NoSettings
from orchestrator.engines.vllm.layouts import VllmLayouts
from orchestrator.engines.vllm.meter import VllmMeter
from orchestrator.engines.vllm.recipe import Recipe

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.inventory import Inventory


def ray_phase(recipe: Recipe, inventory: Inventory, restart: str | None = None,
              spec: Any = None) -> Phase:
    """The nodes working together: a Ray cluster where the image has Ray, else vLLM's own
    multi-node (engines/vllm/multinode.py); first, with `spec`, the memory guard on every
    serving node (it judges the server from the head's status)."""
    from orchestrator.engines.vllm import multinode
    from orchestrator.engines.vllm.serve import status_cmd

    if spec is None:
        return multinode.phase(recipe, inventory, restart)
    head_facts = {"commands": {"serve": status_cmd(recipe.container_name, recipe.port)}}
    return multinode.phase(recipe, inventory, restart, memory_guard(spec), head_facts)


def memory_guard(spec: Any) -> Any:
    """The memory guard on every serving node, on the node itself: it stops the node's Ray
    container (and so vllm serve or its worker) when MemAvailable falls below the threshold."""
    from orchestrator.engines.servers import record_dir
    from orchestrator.phases.memory import NodeGuard

    def not_needed(ctx: Any) -> str | None:
        running = spec.decision(ctx) in ("noop", "loading")
        return "the server already runs (with its guard)" if running else None

    return NodeGuard(spec.serving, record_dir(spec.name), [spec.recipe.container_name],
                     spec.guard_gb, not_needed)


class VllmEngine:
    name = "vllm"
    title = "vLLM"
    ready_line = "Application startup complete."  # uvicorn's, under vllm serve
    recipe_type = Recipe
    spec_meter = VllmMeter  # its speculative-decoding figures in /metrics (bench)
    log_label = "ray"  # `sparkctl logs`: its Ray containers
    health_paths = ("/health", "/v1/models")  # no /health_generate
    layouts = VllmLayouts()  # `sparkctl advise`: layouts and this engine's efficiency
    settings_type = NoSettings  # nothing to set in the inventory's engines.vllm
    process_words = ("vllm",)  # status: its pid files' command lines
    several_servers = False
    # vLLM reads VLLM_API_KEY when --api-key is not given (entrypoints/openai/api_server.py);
    # its AuthenticationMiddleware guards /v1 paths only: /health, /metrics, /version, /ping
    # and the other non-/v1 routes stay open
    api_key = KeyWay("VLLM_API_KEY, exported from the key file by the wrapper that starts "
                     "`vllm serve` in its container", (), guarded_prefix="/v1")

    def placement_problem(self, recipe: Recipe, nodes: list[str], inventory: Inventory) -> str | None:
        from orchestrator.engines.base import head_first_problem, ranks_problem

        rule = (f"tensor_parallel_size {recipe.tensor_parallel_size} x pipeline_parallel_size "
                f"{recipe.pipeline_parallel_size}")
        return (ranks_problem(recipe.world_size, rule, nodes)
                or head_first_problem(self.title, "starts its Ray head and `vllm serve` on the head",
                                      nodes, inventory))

    def containers(self, server: str) -> list[str]:
        from orchestrator.engines.vllm.recipe import DEFAULT_CONTAINER

        return [DEFAULT_CONTAINER]  # one server per cluster, in its Ray containers

    def status_probe(self) -> tuple[str, str] | None:
        from orchestrator.engines.vllm.ray import RAY_PROBE

        return "ray", RAY_PROBE

    def judge_probe(self, server: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        from orchestrator.engines.vllm.ray import judge_probe

        return judge_probe(server, answer)

    def up_phases(self, inventory: Inventory) -> list[Phase]:
        return []

    def up_container(self, inventory: Inventory) -> None:
        return None

    def model_image(self, recipe: Recipe, inventory: Inventory) -> str:
        return recipe.image  # the models are fetched with the image that serves them

    def launch_phases(self, recipe: Recipe, inventory: Inventory, options: LaunchOptions) -> list[Phase]:
        """Refuse another server first (from facts), then the models, the Ray cluster, `vllm
        serve`, and verify steps: ready over HTTP, then one real chat completion."""
        from orchestrator.engines import running, verify
        from orchestrator.engines.liveness import mark_ready
        from orchestrator.engines.serverctl import smoke_test
        from orchestrator.engines.vllm import serve
        from orchestrator.paths import SERVER_JSON
        from orchestrator.phases import models
        from orchestrator.phases.memory import guard_threshold

        spec = serve.ServeSpec(recipe, inventory, options.host, options.replace, options.name,
                               guard_threshold(options.guard_min_available_gb, recipe),
                               options.persist, options.api_key)
        guard = running.guard_phase(recipe, inventory, options.replace,
                                    same_engine=[spec.guard()],
                                    more_facts=serve.guard_facts(spec))
        ready = [
            verify.WaitReady(lambda transports, timeout, note: serve.wait_until_ready(
                transports, recipe, inventory, timeout, note), options.timeout, "vLLM",
                mark=lambda transports: mark_ready(transports[inventory.head_name], SERVER_JSON)),
            verify.SmokeTest(lambda head: smoke_test(head, recipe.container_name, recipe.model,
                                                     recipe.port)),
        ]
        from orchestrator.phases.container import RESTART_POLICY

        restart = RESTART_POLICY if options.persist else None
        from orchestrator.engines import serving_nodes
        from orchestrator.phases import registry

        image_check = registry.phase(recipe.image, serving_nodes(recipe, inventory),
                                     inventory.head_name)
        from orchestrator.engines.vllm.multinode import ray_probe_phase

        probe = ray_probe_phase(recipe, inventory)  # an unknown image forced to Ray: look first
        phases = [guard, image_check, *([probe] if probe else []), models.phase(recipe, inventory),
                  ray_phase(recipe, inventory, restart, spec), serve.phase(spec, ready)]
        from orchestrator.engines import one_server_engines
        from orchestrator.engines.vllm.persist import persist_phase
        from orchestrator.phases.persist import not_persistent_phase

        phases.append(persist_phase(spec, options) if options.persist else
                      not_persistent_phase(options.name or recipe.name, "vllm",
                                           one_server_engines()))
        return phases

    def estimate_memory(self, recipe: Recipe, node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
        from orchestrator.engines.vllm.recipe import estimate_memory

        return estimate_memory(recipe, node_memory_gb)

    def describe(self, recipe: Recipe) -> list[tuple[str, str]]:
        from orchestrator.commands import join
        from orchestrator.engines.base import DEFAULT_HOST
        from orchestrator.engines.vllm.options import version
        from orchestrator.engines.vllm.serve import serve_argv

        if recipe.backend == "ray":
            nodes = (f"head: ray start --head --node-ip-address <head fabric IP> --port "
                     f"{recipe.ray.port} --num-gpus 1 --object-store-memory "
                     f"{int(recipe.ray.object_store_gb * 1e9)}\n"
                     f"workers: ray start --address <head fabric IP>:{recipe.ray.port} "
                     "--node-ip-address <their fabric IP> --num-gpus 1")
            what = "Ray cluster"
        else:
            nodes = "\n".join(f"rank {r}: " + join(serve_argv(recipe, DEFAULT_HOST, r))
                               for r in range(1, recipe.node_count)) or "one node: no other rank"
            what = "vLLM's own multi-node, no Ray (headless ranks)"
        return [(f"{what} ({recipe.container_name} on {recipe.node_count} node(s), "
                 f"{recipe.image})", nodes),
                (f"serve command (in the head's {recipe.container_name}; flags checked against "
                 f"vLLM {version()})", join(serve_argv(recipe, DEFAULT_HOST)))]

    def warnings(self, recipe: Recipe) -> list[str]:
        return []

    def config_preview(self, recipe: Recipe) -> dict[str, object]:
        from orchestrator.engines.base import DEFAULT_HOST
        from orchestrator.engines.vllm.serve import serve_argv

        return {"serve_argv": serve_argv(recipe, DEFAULT_HOST), "image": recipe.image,
                "container": recipe.container_name}


ENGINE = VllmEngine()
