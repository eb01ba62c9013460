"""llama.cpp's layouts for `sparkctl advise`: one node, its RPC layer split over all the nodes
(consecutive layers per node, one after the other: a pipeline of one request, `pp`), and one
replica per node (per-server placement and names, so several run at once). No tensor
parallelism: llama.cpp's RPC backend does not split a layer over nodes."""

from __future__ import annotations

from orchestrator.engines.layouts import DEFAULT_EFFICIENCY, Layout, Published, revalidated, standard_layouts
from orchestrator.engines.llamacpp.recipe import Recipe


class LlamacppLayouts:
    efficiency = DEFAULT_EFFICIENCY
    """No published llama.cpp decode figure on Sparks is fitted yet (docs/advise.md): the
    default between the fitted engines'."""

    published: tuple[Published, ...] = ()

    def layouts(self, recipe: Recipe, nodes: int) -> list[Layout]:
        return standard_layouts(nodes, ("single", "pp", "replicas"))

    def slots(self, recipe: Recipe) -> int:
        """llama-server decodes at most -np requests at once; more wait for a free slot."""
        return recipe.parallel

    def recipe_for(self, recipe: Recipe, layout: Layout, placement: list[str] | None) -> Recipe:
        return revalidated(recipe, nodes=layout.pp if layout.kind == "pp" else 1,
                           placement=placement)
