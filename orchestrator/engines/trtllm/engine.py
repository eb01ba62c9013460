"""TensorRT-LLM's ENGINE (engines/base.py, engines/capabilities.py): what the package
hands out on first use (__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml

from orchestrator.engines.base import FolderPart
from orchestrator.engines.trtllm import keyrelay
from orchestrator.engines.trtllm.readiness import READINESS
from orchestrator.recipe import SPARK_MEMORY_GB, LaunchOptions, MemoryEstimate

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.engines.base import UpContainer
    from orchestrator.engines.trtllm.layouts import TrtllmLayouts
    from orchestrator.engines.trtllm.meter import TrtllmMeter
    from orchestrator.engines.trtllm.recipe import Recipe
    from orchestrator.inventory import Inventory


class TrtllmEngine:
    name = "trtllm"
    title = "TensorRT-LLM"
    readiness = READINESS  # /health, /health_generate (a token through every rank), /v1/models
    # capabilities (engines/capabilities.py); `sparkctl logs`: its server logs are the `up`
    # container's and the run files, so no log label of its own
    api_key = keyrelay.WAY  # trtllm-serve takes no key: sparkctl's relay checks it
    process_words = ("mpirun", "trtllm", "orted", "sparkctl-memguard")  # (serve.OURS)

    # parts in their own modules, imported on first use (FolderPart): a launch or `up`
    # builds every engine it lists but reads a recipe of one, and advise, `recipes import`
    # and bench alone use the rest
    recipe_type: FolderPart[type[Recipe]] = FolderPart("recipe", "Recipe")
    layouts: FolderPart[TrtllmLayouts] = FolderPart("layouts", "TrtllmLayouts", make=True)
    spec_meter: FolderPart[type[TrtllmMeter]] = FolderPart("meter", "TrtllmMeter")

    def placement_problem(self, recipe: Recipe, nodes: list[str], inventory: Inventory) -> str | None:
        from orchestrator.engines.base import ranks_problem

        # one rank per Spark; any node may be rank 0: mpirun runs in that node's `up` container,
        # which reaches every other node's container sshd (the same cluster key, ssh_config and
        # pinned host keys on every node) with the server's own hostfile
        return ranks_problem(recipe.tp_size, f"tp_size {recipe.tp_size}", nodes)

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
        """Judge this server against every node's servers first (from facts), then memory, the
        models and the server, verified ready by a real token through every rank and one chat
        completion."""
        from orchestrator.engines import verify
        from orchestrator.engines.serverctl import smoke_test
        from orchestrator.engines.trtllm import readiness, steps
        from orchestrator.engines.trtllm.serve import LaunchSpec
        from orchestrator.phases import models

        spec = LaunchSpec(recipe, inventory, options)
        # readiness as the shared verify steps: /health, /health_generate (a token through
        # every rank), /v1/models, then one real chat completion
        ready = [
            verify.wait_step(readiness.target(spec), self.readiness, options.timeout,
                             f"the server {spec.name}"),
            steps.Smoke(lambda first: smoke_test(first, spec.container, recipe.model, recipe.port,
                                                 run=spec.run_dir),
                        spec.first),
        ]
        image = self.model_image(recipe, inventory)
        phases = [steps.check_phase(spec), steps.memory_phase(spec), steps.stop_phase(spec),
                  models.phase(recipe, spec.nodes, image, inventory), steps.serve_phase(spec, ready)]
        from orchestrator.engines.trtllm.persist import persist_phase
        from orchestrator.phases.persist import persistence_phase

        phases.append(persistence_phase(spec.name, options.persist,
                                        lambda: persist_phase(spec, options)))
        return phases

    def estimate_memory(self, recipe: Recipe, node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
        from orchestrator.engines.trtllm.recipe import estimate_memory

        return estimate_memory(recipe, node_memory_gb)

    def describe(self, recipe: Recipe) -> list[tuple[str, str]]:
        from orchestrator.commands import join
        from orchestrator.engines.trtllm.serve import (
            CONFIG_NAME,
            render_llm_api_config,
            serve_argv,
            server_dir,
        )
        from orchestrator.recipe import DEFAULT_HOST

        where = ", ".join(recipe.placement) if recipe.placement else "the head"
        return [(f"extra LLM API config ({server_dir(recipe.name)}/{CONFIG_NAME})",
                 render_llm_api_config(recipe)),
                (f"serve command (in the `up` container of the first of {where})",
                 join(serve_argv(recipe, DEFAULT_HOST)))]

    def warnings(self, recipe: Recipe) -> list[str]:
        from orchestrator.engines.trtllm.recipe import draft_dir_warning

        warning = draft_dir_warning(recipe)
        return [warning] if warning else []

    def config_preview(self, recipe: Recipe) -> dict[str, object]:
        """What --json of `recipes show` adds for this engine."""
        return {"llm_api_config": yaml.safe_load(yaml.safe_dump(recipe.llm_api_config()))}


ENGINE = TrtllmEngine()
