"""The one plan of a launch, whoever asks: `sparkctl launch` (and `launch --rolling`, which runs
it once per node group), `advise --measure` (each layout and the restore) and `bench --sweep`
(which runs `sparkctl launch FILE --replace --yes` for each value). Every check runs in all of
them: the recipe against the inventory and the engine's rank rules, the default placement, the
port check, the models' image, the HF token before any download, and with --verify-models the
re-hash of the model files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.core.step import Plan
    from orchestrator.inventory import Inventory
    from orchestrator.recipe import BaseRecipe, LaunchOptions


def checked_recipe(recipe: BaseRecipe, inventory: Inventory) -> BaseRecipe:
    """The recipe refused (exit 2) when this cluster cannot run it, and without `placement`
    when that names the default nodes (the same server as one launched without --nodes)."""
    from orchestrator.engines import check_against_inventory, default_placement

    check_against_inventory(recipe, inventory)
    placed: BaseRecipe = default_placement(recipe, inventory)
    return placed


def launch_plan(recipe: BaseRecipe, inventory: Inventory, options: LaunchOptions,
                verify_models: bool = False) -> Plan:
    """The plan of one launch (pure, no remote call), the recipe checked by `checked_recipe`:
    the models' image and the token check first (a missing or refused token stops before any
    download), then the engine's phases, behind the port check (and --verify-models)."""
    from orchestrator.core.step import Plan
    from orchestrator.engines import capabilities, engine_of
    from orchestrator.engines.apikey import relayed_port  # (an engine behind the key relay)
    from orchestrator.phases import hub_token
    from orchestrator.phases.launch_checks import with_checks
    from orchestrator.recipe import serving_nodes

    engine = engine_of(recipe)
    inner = relayed_port(capabilities.api_key_way(engine), options.api_key, recipe.port)
    nodes, image = serving_nodes(recipe, inventory), engine.model_image(recipe, inventory)
    phases = [*hub_token.phases(recipe, nodes, image, inventory),
              *engine.launch_phases(recipe, inventory, options)]
    return Plan("launch", with_checks(phases, recipe, nodes, image, inventory, verify_models,
                                      options.host, inner, options.name or recipe.name))
