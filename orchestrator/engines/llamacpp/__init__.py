"""llama.cpp: `llama-server` on a server's first node and, for more nodes, `rpc-server` on each of
the others (llama.cpp's RPC backend: the layers are split over the nodes, the weights sent over
the fabric from the first node). GGUF models; one container per server and node,
`sparkctl-llamacpp-<name>`; several servers at once, placed like SGLang's. See docs/engines.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.engines.apikey import KeyWay
from orchestrator.engines.base import SPARK_MEMORY_GB, LaunchOptions, MemoryEstimate, NoSettings
from orchestrator.engines.llamacpp.importer import LlamacppImporter
from orchestrator.engines.llamacpp.layouts import LlamacppLayouts
from orchestrator.engines.llamacpp.ready import READY_LINE
from orchestrator.engines.llamacpp.recipe import Recipe

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.inventory import Inventory


class LlamacppEngine:
    name = "llamacpp"
    title = "llama.cpp"
    ready_line = READY_LINE
    recipe_type = Recipe
    settings_type = NoSettings  # nothing to set in the inventory's engines.llamacpp
    process_words = ()  # status: its pid files' command lines
    several_servers = True
    # llama-server's own --api-key-file (common/arg.cpp); /health, /v1/health and the web UI's
    # assets stay open (tools/server/server-http.cpp, get_public_endpoints)
    api_key = KeyWay("llama-server --api-key-file (it reads the mounted file itself)",
                     ("/health", "/v1/health", "/"))
    """Servers are named and placed (`launch --nodes/--name`), several at once."""
    log_label = "llamacpp"  # `sparkctl logs`: its per-server containers
    health_paths = ("/health", "/v1/models")
    layouts = LlamacppLayouts()  # `sparkctl advise`: one node, the RPC layer split, replicas
    importer = LlamacppImporter()  # `recipes import`: sparkrun's and eugr's recipes of this engine

    @property
    def spec_meter(self) -> type:
        """How `bench` reads llama-server's /metrics (llamacpp:* counters)."""
        from orchestrator.engines.llamacpp.metrics import LlamacppMeter

        return LlamacppMeter

    def placement_problem(self, recipe: Recipe, nodes: list[str], inventory: Inventory) -> str | None:
        return None  # any nodes: llama-server on the first, an rpc-server on each other one

    def containers(self, server: str) -> list[str]:
        return [f"sparkctl-llamacpp-{server}"] if server else []

    def status_probe(self) -> tuple[str, str] | None:
        return None

    def judge_probe(self, server: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        return {}

    def up_phases(self, inventory: Inventory) -> list[Phase]:
        return []

    def up_container(self, inventory: Inventory) -> None:
        return None

    def model_image(self, recipe: Recipe, inventory: Inventory) -> str:
        return recipe.image  # the models are fetched with the image that serves them

    def launch_phases(self, recipe: Recipe, inventory: Inventory, options: LaunchOptions) -> list[Phase]:
        """Judge this server against every node's servers (from facts), the GGUF on the first
        node, the rpc-servers (reachable from the first node), llama-server, its record,
        readiness and one real chat completion."""
        from orchestrator.engines import verify
        from orchestrator.engines.liveness import mark_ready
        from orchestrator.engines.llamacpp import ready, serve
        from orchestrator.engines.placed import Smoke, check_phase
        from orchestrator.engines.servers import record_dir
        from orchestrator.phases import models, registry
        from orchestrator.phases.persist import not_persistent_phase

        spec = serve.ServeSpec(recipe, inventory, options)
        steps = [verify.WaitReady(lambda transports, timeout, note: ready.wait_until_ready(
                     transports, spec, timeout, note), options.timeout, f"llama.cpp ({spec.name})",
                     mark=lambda transports: mark_ready(
                         transports[spec.first], f"{record_dir(spec.name)}/server.json")),
                 Smoke(spec)]
        # only llama-server reads the GGUF: the rpc-servers get their layers from it over RPC
        first_only = recipe.model_copy(update={"placement": [spec.first], "nodes": 1})
        phases = [check_phase(spec),
                  registry.phase(recipe.image, spec.nodes, inventory.head_name),
                  models.phase(first_only, inventory), serve.rpc_phase(spec),
                  serve.serve_phase(spec, steps)]
        if options.persist:
            from orchestrator.engines.placed import persist_phase

            # every container (rpc-server on the other nodes, llama-server on the first) comes
            # back with docker at boot; llama-server connects to the rpc-servers when it starts
            # (one that comes up later makes it exit, and the boot unit starts it again)
            phases.append(persist_phase(spec, options, self.name, "rpc-server"))
        else:
            phases.append(not_persistent_phase(spec.name, self.name))
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
