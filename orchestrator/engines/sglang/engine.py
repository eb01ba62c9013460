"""SGLang's ENGINE (engines/base.py, engines/capabilities.py): what the package
hands out on first use (__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.engines.apikey import KeyWay
from orchestrator.engines.base import FolderPart
from orchestrator.engines.sglang.ready import READINESS
from orchestrator.recipe import SPARK_MEMORY_GB, LaunchOptions, MemoryEstimate

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.engines.sglang.importer import SglangImporter
    from orchestrator.engines.sglang.layouts import SglangLayouts
    from orchestrator.engines.sglang.meter import SglangMeter
    from orchestrator.engines.sglang.recipe import Recipe
    from orchestrator.inventory import Inventory


class SglangEngine:
    name = "sglang"
    title = "SGLang"
    readiness = READINESS  # /health 200 and its ready line, logged after its warm-up request
    # capabilities (engines/capabilities.py)
    log_label = "sglang"  # `sparkctl logs`: its per-server containers
    # SGLang 0.5.12 takes the key only as --api-key VALUE (server_args.py), or from a YAML
    # `--config` file it merges into its arguments in-process (server_args_config_parser.py):
    # an entry wrapper writes that file inside the container from the mounted key. /health*
    # and /metrics* stay open (srt/utils/auth.py, decide_request_auth)
    api_key = KeyWay("SGLang --config FILE.yaml with `api-key:` (written in the container by "
                     "an entry wrapper from the mounted key file)", ("/health*", "/metrics*"))

    # parts in their own modules, imported on first use (FolderPart): a launch or `up`
    # builds every engine it lists but reads a recipe of one, and advise, `recipes import`
    # and bench alone use the rest
    recipe_type: FolderPart[type[Recipe]] = FolderPart("recipe", "Recipe")
    layouts: FolderPart[SglangLayouts] = FolderPart("layouts", "SglangLayouts", make=True)
    importer: FolderPart[SglangImporter] = FolderPart("importer", "SglangImporter", make=True)
    spec_meter: FolderPart[type[SglangMeter]] = FolderPart("meter", "SglangMeter")

    def placement_problem(self, recipe: Recipe, nodes: list[str], inventory: Inventory) -> str | None:
        from orchestrator.engines.base import ranks_problem

        # SGLang asserts tp x pp divisible by --nnodes; sparkctl runs one rank per Spark
        return ranks_problem(recipe.world_size, f"tp_size {recipe.tp_size} x pp_size "
                             f"{recipe.pp_size}", nodes)

    def containers(self, server: str) -> list[str]:
        return [f"sparkctl-sglang-{server}"] if server else []

    def model_image(self, recipe: Recipe, inventory: Inventory) -> str:
        return recipe.image  # the models are fetched with the image that serves them

    def launch_phases(self, recipe: Recipe, inventory: Inventory, options: LaunchOptions) -> list[Phase]:
        """Judge this server against every node's servers (from facts), the models, then the
        server's containers, its record, readiness and one real chat completion."""
        from orchestrator.engines import placed, verify
        from orchestrator.engines.sglang import ready, serve
        from orchestrator.phases import models, registry
        from orchestrator.phases.persist import persistence_phase

        spec = serve.ServeSpec(recipe, inventory, options)
        steps = [verify.wait_step(ready.target(spec), self.readiness, options.timeout,
                                  f"SGLang ({spec.name})"), placed.Smoke(spec)]
        phases = [placed.check_phase(spec),
                  registry.phase(recipe.image, spec.nodes, inventory.head_name),
                  models.phase(recipe, spec.nodes, recipe.image, inventory), serve.serve_phase(spec, steps)]
        # --persist: each rank's container is the server, restarted by docker at boot; the
        # ranks meet at the first node's --dist-init-addr again (torch.distributed waits for
        # all of them, so the order docker starts them in does not matter)
        phases.append(persistence_phase(spec.name, options.persist, lambda: placed.persist_phase(
            spec, options, self.name, "SGLang rank {index}")))
        return phases

    def estimate_memory(self, recipe: Recipe, node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
        from orchestrator.engines.sglang.recipe import estimate_memory

        return estimate_memory(recipe, node_memory_gb)

    def describe(self, recipe: Recipe) -> list[tuple[str, str]]:
        from orchestrator.commands import join
        from orchestrator.engines.sglang.options import version
        from orchestrator.engines.sglang.serve import preview

        where = ", ".join(recipe.placement) if recipe.placement else "the head"
        return [(f"launch command (container sparkctl-sglang-{recipe.name} of {recipe.image} on "
                 f"{where}; flags checked against SGLang {version()})", join(preview(recipe)))]

    def config_preview(self, recipe: Recipe) -> dict[str, object]:
        from orchestrator.engines.sglang.serve import preview

        return {"serve_argv": preview(recipe), "image": recipe.image,
                "container": f"sparkctl-sglang-{recipe.name}"}


ENGINE = SglangEngine()
