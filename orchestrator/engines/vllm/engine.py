"""vLLM's ENGINE (engines/base.py, engines/capabilities.py): what the package
hands out on first use (__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.engines.apikey import KeyWay
from orchestrator.engines.base import FolderPart
from orchestrator.engines.vllm.ready import READINESS
from orchestrator.recipe import SPARK_MEMORY_GB, LaunchOptions, MemoryEstimate
from orchestrator.records import ServerRecord
from orchestrator.remote.fact_records import CommandResult

if TYPE_CHECKING:
    from orchestrator.core.step import Phase, Step
    from orchestrator.engines.vllm.importer import VllmImporter
    from orchestrator.engines.vllm.layouts import VllmLayouts
    from orchestrator.engines.vllm.meter import VllmMeter
    from orchestrator.engines.vllm.recipe import Recipe
    from orchestrator.engines.vllm.serve import ServeSpec
    from orchestrator.inventory import Inventory


def memory_guard(spec: ServeSpec) -> Step:
    """The memory guard on every node of the server, on the node itself: it stops the server's
    container there (and so vllm serve, its Ray node or its rank) when MemAvailable falls below
    the threshold."""
    from orchestrator.engines.servers import record_dir
    from orchestrator.phases.memory import NodeGuard

    def not_needed(ctx: Any) -> str | None:
        return "the server already runs (with its guard)" if spec.runs(ctx) else None

    return NodeGuard(spec.nodes, record_dir(spec.name), [spec.container], spec.guard_gb,
                     not_needed)


class VllmEngine:
    name = "vllm"
    title = "vLLM"
    readiness = READINESS  # /health, /v1/models; vllm serve's pid file the dead-rank check
    # capabilities (engines/capabilities.py)
    log_label = "ray"  # `sparkctl logs`: its Ray containers
    process_words = ("vllm",)  # status: its pid files' command lines
    # vLLM reads VLLM_API_KEY when --api-key is not given (entrypoints/openai/api_server.py);
    # its AuthenticationMiddleware guards /v1 paths only: /health, /metrics, /version, /ping
    # and the other non-/v1 routes stay open
    api_key = KeyWay("VLLM_API_KEY, exported from the key file by the wrapper that starts "
                     "`vllm serve` in its container", (), guarded_prefix="/v1")

    # parts in their own modules, imported on first use (FolderPart): a launch or `up`
    # builds every engine it lists but reads a recipe of one, and advise, `recipes import`
    # and bench alone use the rest
    recipe_type: FolderPart[type[Recipe]] = FolderPart("recipe", "Recipe")
    layouts: FolderPart[VllmLayouts] = FolderPart("layouts", "VllmLayouts", make=True)
    importer: FolderPart[VllmImporter] = FolderPart("importer", "VllmImporter", make=True)
    spec_meter: FolderPart[type[VllmMeter]] = FolderPart("meter", "VllmMeter")

    def placement_problem(self, recipe: Recipe, nodes: list[str], inventory: Inventory) -> str | None:
        from orchestrator.engines.base import ranks_problem

        # one rank per Spark: tp x pp ranks on as many nodes; the first of them is the Ray head
        # (or mp master) and serves the API, whichever node of the inventory it is
        rule = (f"tensor_parallel_size {recipe.tensor_parallel_size} x pipeline_parallel_size "
                f"{recipe.pipeline_parallel_size}")
        return ranks_problem(recipe.world_size, rule, nodes)

    def containers(self, server: str) -> list[str]:
        from orchestrator.engines.vllm.recipe import DEFAULT_CONTAINER

        # a named server's own containers; "" : the one container of the single-server layout
        # (an earlier sparkctl's), which `down` still inspects and removes
        return [f"{DEFAULT_CONTAINER}-{server}"] if server else [DEFAULT_CONTAINER]

    def status_probe(self) -> tuple[str, str]:
        from orchestrator.engines.vllm.ray import RAY_PROBE

        return "ray", RAY_PROBE

    def judge_probe(self, server: ServerRecord, answer: CommandResult | None) -> dict[str, Any]:
        from orchestrator.engines.vllm.ray import judge_probe

        return judge_probe(server, answer)

    def model_image(self, recipe: Recipe, inventory: Inventory) -> str:
        return recipe.image  # the models are fetched with the image that serves them

    def launch_phases(self, recipe: Recipe, inventory: Inventory, options: LaunchOptions) -> list[Phase]:
        """This server judged against every node's servers (from facts), the image, the models,
        the server's containers (its Ray cluster or mp ranks, the memory guard first), `vllm
        serve`, and verify steps: ready over HTTP, then one real chat completion."""
        from orchestrator.engines import verify
        from orchestrator.engines.vllm import check, multinode, ready, serve
        from orchestrator.phases import models, registry
        from orchestrator.phases.container import RESTART_POLICY
        from orchestrator.phases.persist import persistence_phase

        spec = serve.ServeSpec(recipe, inventory, options)
        steps = [verify.wait_step(ready.target(spec), self.readiness, options.timeout,
                                  f"vLLM ({spec.name})"), serve.Smoke(spec)]
        restart = RESTART_POLICY if options.persist else None
        probe = multinode.ray_probe_phase(spec)  # an unknown image forced to Ray: look first
        phases = [check.check_phase(spec),
                  registry.phase(recipe.image, spec.nodes, inventory.head_name),
                  *([probe] if probe else []), models.phase(recipe, spec.nodes, recipe.image, inventory),
                  multinode.phase(spec, restart, memory_guard(spec)), serve.serve_phase(spec, steps)]
        from orchestrator.engines.vllm.persist import persist_phase

        phases.append(persistence_phase(spec.name, options.persist,
                                        lambda: persist_phase(spec, options)))
        return phases

    def estimate_memory(self, recipe: Recipe, node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
        from orchestrator.engines.vllm.recipe import estimate_memory

        return estimate_memory(recipe, node_memory_gb)

    def describe(self, recipe: Recipe) -> list[tuple[str, str]]:
        from orchestrator.commands import join
        from orchestrator.engines.vllm.options import version
        from orchestrator.engines.vllm.ports import ServerPorts
        from orchestrator.engines.vllm.serve import FIRST_IP, serve_argv
        from orchestrator.recipe import DEFAULT_HOST

        ports = ServerPorts.of(recipe)
        if recipe.backend == "ray":
            own = join(ports.ray_node.args())
            nodes = (f"first node: ray start --head --node-ip-address {FIRST_IP} --port "
                     f"{ports.ray} {own} --num-gpus 1 "
                     f"--object-store-memory {int(recipe.ray.object_store_gb * 1e9)}\n"
                     f"the others: ray start --address {FIRST_IP}:{ports.ray} --node-ip-address "
                     f"<their fabric IP> {own} --num-gpus 1\n"
                     "every node: its port guard (iptables chain sparkctl-ray-<server>) closes "
                     "these ports on every interface but lo and the fabric")
            what = "its own Ray cluster"
        else:
            nodes = "\n".join(f"rank {r}: " + join(serve_argv(recipe, DEFAULT_HOST, r))
                               for r in range(1, recipe.node_count)) or "one node: no other rank"
            what = "vLLM's own multi-node, no Ray (headless ranks)"
        where = ", ".join(recipe.placement) if recipe.placement else "the head first"
        container = f"{recipe.container_name}-{recipe.name}"
        return [(f"{what} ({container} on {recipe.node_count} node(s): {where}; {recipe.image})",
                 nodes),
                (f"serve command (in the first node's {container}; flags checked against "
                 f"vLLM {version()})", join(serve_argv(recipe, DEFAULT_HOST)))]

    def config_preview(self, recipe: Recipe) -> dict[str, object]:
        from orchestrator.engines.vllm.serve import serve_argv
        from orchestrator.recipe import DEFAULT_HOST

        return {"serve_argv": serve_argv(recipe, DEFAULT_HOST), "image": recipe.image,
                "container": f"{recipe.container_name}-{recipe.name}"}


ENGINE = VllmEngine()
