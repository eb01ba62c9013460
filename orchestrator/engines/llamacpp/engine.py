"""llama.cpp's ENGINE (engines/base.py, engines/capabilities.py): what the package
hands out on first use (__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.engines.apikey import KeyWay
from orchestrator.engines.base import FolderPart
from orchestrator.engines.llamacpp.ready import READINESS
from orchestrator.recipe import SPARK_MEMORY_GB, LaunchOptions, MemoryEstimate

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.engines.llamacpp.importer import LlamacppImporter
    from orchestrator.engines.llamacpp.layouts import LlamacppLayouts
    from orchestrator.engines.llamacpp.metrics import LlamacppMeter
    from orchestrator.engines.llamacpp.recipe import Recipe
    from orchestrator.inventory import Inventory


class LlamacppEngine:
    name = "llamacpp"
    title = "llama.cpp"
    readiness = READINESS  # /health 200 and the model listed; rpc-server containers running
    # capabilities (engines/capabilities.py)
    # llama-server's own --api-key-file (common/arg.cpp); /health, /v1/health and the web UI's
    # assets stay open (tools/server/server-http.cpp, get_public_endpoints)
    api_key = KeyWay("llama-server --api-key-file (it reads the mounted file itself)",
                     ("/health", "/v1/health", "/"))
    log_label = "llamacpp"  # `sparkctl logs`: its per-server containers

    # parts in their own modules, imported on first use (FolderPart): a launch or `up`
    # builds every engine it lists but reads a recipe of one, and advise, `recipes import`
    # and bench alone use the rest
    recipe_type: FolderPart[type[Recipe]] = FolderPart("recipe", "Recipe")
    layouts: FolderPart[LlamacppLayouts] = FolderPart("layouts", "LlamacppLayouts", make=True)
    importer: FolderPart[LlamacppImporter] = FolderPart("importer", "LlamacppImporter", make=True)
    spec_meter: FolderPart[type[LlamacppMeter]] = FolderPart("metrics", "LlamacppMeter")

    def placement_problem(self, recipe: Recipe, nodes: list[str], inventory: Inventory) -> str | None:
        return None  # any nodes: llama-server on the first, an rpc-server on each other one

    def containers(self, server: str) -> list[str]:
        return [f"sparkctl-llamacpp-{server}"] if server else []

    def model_image(self, recipe: Recipe, inventory: Inventory) -> str:
        return recipe.image  # the models are fetched with the image that serves them

    def launch_phases(self, recipe: Recipe, inventory: Inventory, options: LaunchOptions) -> list[Phase]:
        """Judge this server against every node's servers (from facts), the GGUF on the first
        node, the rpc-servers (reachable from the first node), llama-server, its record,
        readiness and one real chat completion."""
        from orchestrator.engines import verify
        from orchestrator.engines.llamacpp import ready, serve
        from orchestrator.engines.placed import Smoke, check_phase
        from orchestrator.phases import models, registry
        from orchestrator.phases.persist import persistence_phase

        spec = serve.ServeSpec(recipe, inventory, options)
        steps = [verify.wait_step(ready.target(spec), self.readiness, options.timeout,
                                  f"llama.cpp ({spec.name})"), Smoke(spec)]
        # only llama-server reads the GGUF: the rpc-servers get their layers from it over RPC
        phases = [check_phase(spec),
                  registry.phase(recipe.image, spec.nodes, inventory.head_name),
                  models.phase(recipe, [spec.first], recipe.image, inventory), serve.rpc_phase(spec),
                  serve.serve_phase(spec, steps)]
        from orchestrator.engines.placed import persist_phase

        # every container (rpc-server on the other nodes, llama-server on the first) comes
        # back with docker at boot; llama-server connects to the rpc-servers when it starts
        # (one that comes up later makes it exit, and the boot unit starts it again)
        phases.append(persistence_phase(spec.name, options.persist, lambda: persist_phase(
            spec, options, self.name, "rpc-server")))
        return phases

    def estimate_memory(self, recipe: Recipe, node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
        from orchestrator.engines.llamacpp.recipe import estimate_memory

        return estimate_memory(recipe, node_memory_gb)

    def describe(self, recipe: Recipe) -> list[tuple[str, str]]:
        from orchestrator.commands import join
        from orchestrator.engines.llamacpp.options import version
        from orchestrator.engines.llamacpp.serve import preview, rpc_argv

        where = ", ".join(recipe.placement) if recipe.placement else "the head"
        out = [(f"llama-server (container sparkctl-llamacpp-{recipe.name} of {recipe.image} on "
                f"{where}; flags checked against llama.cpp {version()})", join(preview(recipe)))]
        if recipe.node_count > 1:
            out.append((f"rpc-server on each of the other {recipe.node_count - 1} node(s)",
                        join(["rpc-server", *rpc_argv(recipe, "<its fabric IP>")])))
        return out

    def warnings(self, recipe: Recipe) -> list[str]:
        if recipe.node_count > 1:
            return ["llama.cpp's RPC backend splits layers, it does not run them in parallel: two "
                    "nodes hold a model one cannot, at about one node's speed or less"]
        return []

    def config_preview(self, recipe: Recipe) -> dict[str, object]:
        from orchestrator.engines.llamacpp.serve import preview

        return {"serve_argv": preview(recipe), "image": recipe.image,
                "container": f"sparkctl-llamacpp-{recipe.name}"}


ENGINE = LlamacppEngine()
