"""TensorRT-LLM over MPI: a container with its own sshd on every node, an MPI hostfile over the
fabric, and `mpirun ... trtllm-llmapi-launch trtllm-serve` started on the head.

`up` adds the container and MPI phases; `launch` fetches the models, writes the extra LLM API
options and starts the server; readiness is /health, /health_generate (one token through every
rank) and /v1/models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from orchestrator.engines.base import SPARK_MEMORY_GB, LaunchOptions, MemoryEstimate
from orchestrator.engines.trtllm import keyrelay
from orchestrator.engines.trtllm.layouts import TrtllmLayouts
from orchestrator.engines.trtllm.meter import TrtllmMeter
from orchestrator.engines.trtllm.recipe import Recipe
from orchestrator.engines.trtllm.settings import Settings

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.engines.base import UpContainer
    from orchestrator.inventory import Inventory


class TrtllmEngine:
    name = "trtllm"
    title = "TensorRT-LLM"
    ready_line = "Application startup complete."  # uvicorn's, under trtllm-serve
    recipe_type = Recipe
    spec_meter = TrtllmMeter  # its speculative-decoding figures in /metrics (bench)
    log_label = ""  # `sparkctl logs`: its server logs are the `up` container's and the run files
    health_paths = ("/health", "/health_generate")  # one token through every rank
    layouts = TrtllmLayouts()  # `sparkctl advise`: layouts and this engine's efficiency
    settings_type = Settings  # engines.trtllm in the inventory: its `up` container
    process_words = ("mpirun", "trtllm", "orted")  # status: its pid files' command lines
    several_servers = False
    api_key = keyrelay.WAY  # trtllm-serve takes no key: sparkctl's relay checks it

    def placement_problem(self, recipe: Recipe, nodes: list[str], inventory: Inventory) -> str | None:
        from orchestrator.engines.base import head_first_problem, ranks_problem

        return (ranks_problem(recipe.tp_size, f"tp_size {recipe.tp_size}", nodes)
                or head_first_problem(self.title, "runs mpirun in the head's `up` container",
                                      nodes, inventory))

    def containers(self, server: str) -> list[str]:
        return []  # its server runs in the `up` container, which stays

    def status_probe(self) -> tuple[str, str] | None:
        return None

    def judge_probe(self, server: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        return {}

    def up_phases(self, inventory: Inventory) -> list[Phase]:
        """SSH trust (with its MPI hostfile), its container with sshd, then the MPI proof."""
        from orchestrator.engines.trtllm import container, mpi, up
        from orchestrator.phases import ssh_keys

        return [*ssh_keys.phases(inventory, up.hostfile), container.phase(inventory),
                mpi.phase(inventory)]

    def up_container(self, inventory: Inventory) -> UpContainer | None:
        from orchestrator.engines.trtllm.up import up_container

        return up_container(inventory) if inventory.serves(self.name) else None

    def model_image(self, recipe: Recipe, inventory: Inventory) -> str:
        return inventory.settings(self.name).container.image  # `up` put it on every node

    def launch_phases(self, recipe: Recipe, inventory: Inventory, options: LaunchOptions) -> list[Phase]:
        """Refuse a different running server first (from facts), then the models, then the
        server, verified ready by a real token through every rank and one chat completion."""
        from orchestrator.engines import running, verify
        from orchestrator.engines.liveness import mark_ready
        from orchestrator.engines.serverctl import smoke_test
        from orchestrator.engines.trtllm import readiness, serve
        from orchestrator.paths import SERVER_JSON
        from orchestrator.phases import models

        spec = serve.LaunchSpec(recipe, inventory, options.host, options.replace, options.drop_caches,
                                options.guard_min_available_gb, options.name, options.persist,
                                options.api_key)
        guard = running.guard_phase(recipe, inventory, options.replace,
                                    same_engine=[spec.guard()],
                                    more_facts=serve.guard_facts(spec))
        # readiness as the shared verify steps: /health, /health_generate (a token through
        # every rank), /v1/models, then one real chat completion
        ready = [
            verify.WaitReady(lambda transports, timeout, note: readiness.wait_until_ready(
                transports, inventory, recipe.model, recipe.port, timeout, note),
                options.timeout, "the server",
                mark=lambda transports: mark_ready(transports[inventory.head_name], SERVER_JSON)),
            verify.SmokeTest(lambda head: smoke_test(
                head, inventory.container.name, recipe.model, recipe.port)),
        ]
        phases = [guard, serve.memory_phase(spec), serve.stop_phase(spec),
                  models.phase(recipe, inventory), serve.phase(spec, ready)]
        from orchestrator.engines import one_server_engines
        from orchestrator.engines.trtllm.persist import persist_phase
        from orchestrator.phases.persist import not_persistent_phase

        phases.append(persist_phase(spec, options) if options.persist else
                      not_persistent_phase(options.name or recipe.name, "trtllm",
                                           one_server_engines()))
        return phases

    def estimate_memory(self, recipe: Recipe, node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
        from orchestrator.engines.trtllm.recipe import estimate_memory

        return estimate_memory(recipe, node_memory_gb)

    def describe(self, recipe: Recipe) -> list[tuple[str, str]]:
        from orchestrator.commands import join
        from orchestrator.engines.base import DEFAULT_HOST
        from orchestrator.engines.trtllm.serve import CONFIG_PATH, render_llm_api_config, serve_argv

        return [(f"extra LLM API config ({CONFIG_PATH})", render_llm_api_config(recipe)),
                ("serve command (in the head container)", join(serve_argv(recipe, DEFAULT_HOST)))]

    def warnings(self, recipe: Recipe) -> list[str]:
        from orchestrator.engines.trtllm.recipe import draft_dir_warning

        warning = draft_dir_warning(recipe)
        return [warning] if warning else []

    def config_preview(self, recipe: Recipe) -> dict[str, object]:
        """What --json of `recipes show` adds for this engine."""
        return {"llm_api_config": yaml.safe_load(yaml.safe_dump(recipe.llm_api_config()))}


ENGINE = TrtllmEngine()
