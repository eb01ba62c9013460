"""The read-only checks every launch puts before its engine's phases: the port check
(phases/ports.py) and, with --verify-models, the re-hash of every model file
(phases/verify_models.py). Apart from both so neither imports the other's dependencies."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.core.step import Phase
from orchestrator.inventory import Inventory
from orchestrator.phases.ports import with_port_check

if TYPE_CHECKING:
    from orchestrator.recipe import BaseRecipe


def with_checks(phases: list[Phase], recipe: BaseRecipe, nodes: list[str], image: str,
                inventory: Inventory, verify_models: bool = False, host: str = "*",
                inner_port: int | None = None, server: str | None = None) -> list[Phase]:
    """A launch's engine phases behind the port check on its NODES and, with --verify-models,
    the re-hash of every model file in containers of IMAGE (phases/verify_models.py), both
    read-only until they find something. INNER_PORT: where an engine behind sparkctl's
    key-checking relay binds 127.0.0.1."""
    if verify_models:
        from orchestrator.phases import verify_models as verify

        phases = [verify.phase(recipe, nodes, image, inventory), *phases]
    # the HTTP port is bound on --host only (127.0.0.1 by default); the others on every address
    wanted = [p._replace(address=host) if p.what == "HTTP" else p
              for p in recipe.listen_ports(nodes)]
    if inner_port is not None:
        from orchestrator.recipe import ListenPort

        wanted.append(ListenPort(nodes[0], inner_port, "the engine behind the API key relay",
                                 "launch with another --port", "127.0.0.1"))
    return with_port_check(phases, wanted, server)
