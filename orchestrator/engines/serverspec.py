"""One server of one launch, whatever the engine: the fields every engine's launch has, computed
once per launch from the recipe, the inventory and launch's options. Each engine's spec
(engines/NAME/serve.py) subclasses it and adds only its own fields (its argv and digest, ports,
files); the readiness wait's `Target` and the placement judgement's `Wanted` come from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from orchestrator.engines import apikey
from orchestrator.engines.readiness import FirstRequest

if TYPE_CHECKING:
    from orchestrator.engines.readiness import Target
    from orchestrator.engines.servers import Wanted
    from orchestrator.inventory import Inventory
    from orchestrator.recipe import BaseRecipe, LaunchOptions, MemoryEstimate, Note
    from orchestrator.remote.transport import Transport


class ServerSpec:
    """name, host, port, nodes (first = where it answers), container, memory estimate, API key
    (and its node file), and the configuration digest the engine sets from its own argv."""

    def __init__(self, recipe: BaseRecipe, inventory: Inventory, options: LaunchOptions,
                 container: str) -> None:
        """CONTAINER: the container its first node's server runs in; `{name}` in it is the
        server's name."""
        from orchestrator.engines import engine_of
        from orchestrator.engines.serverctl import smoke_body
        from orchestrator.recipe import serving_nodes

        self.recipe, self.inventory, self.options = recipe, inventory, options
        self.name = options.name or recipe.name
        self.host = options.host
        self.port = recipe.port
        self.nodes = serving_nodes(recipe, inventory)
        self.first = self.nodes[0]
        self.container = container.format(name=self.name)
        self.estimate: MemoryEstimate = engine_of(recipe).estimate_memory(recipe)
        self.key = options.api_key
        self.key_file = apikey.node_key_file(self.name) if self.key is not None else None
        """The server's API key file on its first node (probes read it there), or None."""
        self.digest = ""
        """What makes a running server the same server (engines.config_hash): set by the engine."""
        self.first_request = FirstRequest(smoke_body(recipe.model))
        """The launch's one chat completion (its smoke test), sent by the readiness wait once
        ready where that wait looks on the node (engines/readiness.FirstRequest)."""

    def record(self) -> dict[str, Any]:
        """Its server.json (orchestrator/records.ServerRecord's fields and the engine's own)."""
        raise NotImplementedError(f"{type(self).__name__} must say what its record holds")

    def listen_ports(self) -> list[int]:
        """The ports it binds (placement against the other servers); engines add theirs."""
        return [self.port]

    def wanted(self) -> Wanted:
        from orchestrator.engines.servers import Wanted

        return Wanted(self.name, self.recipe.engine, self.recipe.model, self.nodes,
                      self.listen_ports(), self.estimate.total_gb, self.digest)

    def target(self, launcher: str, ranks: str,
               fail: Callable[[dict[str, Transport], Note, str], NoReturn],
               **launcher_fields: Any) -> Target:
        """What the one readiness wait (engines/readiness.py) waits for: LAUNCHER and RANKS as a
        user knows them, FAIL the engine's clean-up with its own log tails."""
        from orchestrator.engines.readiness import Target

        return Target(self.name, list(self.nodes), self.container, self.recipe.model, self.port,
                      self.host, self.key_file, launcher=launcher, ranks=ranks, fail=fail,
                      first_request=self.first_request, **launcher_fields)
