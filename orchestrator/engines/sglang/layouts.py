"""SGLang's layouts for `sparkctl advise`: one node, tensor parallel over all, pipeline
parallel (not with speculative decoding, which SGLang refuses with pp > 1) and one replica per
node (per-server placement and names, so several run at once)."""

from __future__ import annotations

from orchestrator.engines.layouts import Kind, Layout, Published, revalidated, standard_layouts
from orchestrator.engines.sglang.recipe import Recipe


class SglangLayouts:
    efficiency = 0.79
    """Fitted to the seed blog's Qwen3.6-27B-FP8 with NEXTN on one Spark (22.6 t/s at one
    request, 95 t/s aggregate at 8): docs/advise.md has the arithmetic and each error."""

    published = (
        Published("Qwen3.6-27B-FP8 NEXTN, 1 Spark, 1 request", "Qwen/Qwen3.6-27B-FP8",
                  Layout("single"), 1, 22.6, "the seed blog (al-engr.com), llama-benchy tg",
                  draft_len=5),
        Published("Qwen3.6-27B-FP8 NEXTN, 1 Spark, 8 requests", "Qwen/Qwen3.6-27B-FP8",
                  Layout("single"), 8, 95.0, "the seed blog (al-engr.com), llama-benchy tg c8",
                  draft_len=5),
    )

    def layouts(self, recipe: Recipe, nodes: int) -> list[Layout]:
        # SGLang asserts pp > 1 excludes speculative decoding (recipe.py checks it too)
        kinds: tuple[Kind, ...] = ("single", "tp", "replicas") if recipe.speculative else \
            ("single", "tp", "pp", "replicas")
        return standard_layouts(nodes, kinds)

    def recipe_for(self, recipe: Recipe, layout: Layout, placement: list[str] | None) -> Recipe:
        return revalidated(recipe, tp_size=layout.tp, pp_size=layout.pp, nodes=None,
                           placement=placement)
