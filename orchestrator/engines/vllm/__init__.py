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

from typing import TYPE_CHECKING

from orchestrator.engines.base import SPARK_MEMORY_GB, LaunchOptions, MemoryEstimate
from orchestrator.engines.vllm.layouts import VllmLayouts
from orchestrator.engines.vllm.recipe import Recipe

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.inventory import Inventory


def ray_phase(recipe: Recipe, inventory: Inventory, restart: str | None = None) -> Phase:
    """The nodes working together: a Ray cluster where the image has Ray, else vLLM's own
    multi-node (engines/vllm/multinode.py)."""
    from orchestrator.engines.vllm import multinode

    return multinode.phase(recipe, inventory, restart)


class VllmEngine:
    name = "vllm"
    title = "vLLM"
    ready_line = "Application startup complete."  # uvicorn's, under vllm serve
    recipe_type = Recipe
    layouts = VllmLayouts()  # `sparkctl advise`: layouts and this engine's efficiency

    def up_phases(self, inventory: Inventory) -> list[Phase]:
        return []

    def launch_phases(self, recipe: Recipe, inventory: Inventory, options: LaunchOptions) -> list[Phase]:
        """Refuse another server first (from facts), then the models, the Ray cluster, `vllm
        serve`, and verify steps: ready over HTTP, then one real chat completion."""
        from orchestrator.engines import running, verify
        from orchestrator.engines.liveness import mark_ready
        from orchestrator.engines.trtllm.readiness import smoke_test
        from orchestrator.engines.vllm import serve
        from orchestrator.paths import SERVER_JSON
        from orchestrator.phases import models

        spec = serve.ServeSpec(recipe, inventory, options.host, options.replace)
        guard = running.guard_phase(recipe, inventory, options.replace,
                                    same_engine=[serve.ServerGuard(spec)],
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
                  ray_phase(recipe, inventory, restart), serve.phase(spec, ready)]
        from orchestrator.engines.vllm.persist import persist_phase
        from orchestrator.phases.persist import not_persistent_phase

        phases.append(persist_phase(spec, options) if options.persist else
                      not_persistent_phase(options.name or recipe.name, "vllm"))
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
