"""llama.cpp's layouts for `sparkctl advise`: one node, its RPC layer split over all the nodes
(consecutive layers per node, one after the other: a pipeline of one request, `pp`), and one
replica per node (per-server placement and names, so several run at once). No tensor
parallelism: llama.cpp's RPC backend does not split a layer over nodes."""

from __future__ import annotations

from orchestrator.engines.layouts import Layout, Published, revalidated, standard_layouts
from orchestrator.engines.llamacpp.recipe import Recipe


class LlamacppLayouts:
    efficiency = 0.75
    """Fitted to llama.cpp's own Spark figures for gpt-oss-120b (below): 0.75 predicts both
    within 11 % (the default 0.6 would be 28-29 % slow)."""

    published: tuple[Published, ...] = (
        Published("gpt-oss-120b MXFP4 GGUF, 1 Spark, llama-bench tg32", "ggml-org/gpt-oss-120b-GGUF",
                  Layout("single"), 1, 59.02,
                  "ggml-org/llama.cpp benches/dgx-spark.md: llama-bench -fa 1 -ub 2048, tg32 "
                  "59.02 +- 0.17 t/s (build 2f68ce7cf, 6918)"),
        Published("gpt-oss-120b MXFP4 GGUF, 1 Spark, 4 requests", "ggml-org/gpt-oss-120b-GGUF",
                  Layout("single"), 4, 95.08,
                  "ggml-org/llama.cpp benches/dgx-spark.md: llama-batched-bench PP 512, TG 32, "
                  "B 4: S_TG 95.08 t/s (build 6918)"),
    )

    def layouts(self, recipe: Recipe, nodes: int) -> list[Layout]:
        return standard_layouts(nodes, ("single", "pp", "replicas"))

    def slots(self, recipe: Recipe) -> int:
        """llama-server decodes at most -np requests at once; more wait for a free slot."""
        return recipe.parallel

    def recipe_for(self, recipe: Recipe, layout: Layout, placement: list[str] | None) -> Recipe:
        return revalidated(recipe, nodes=layout.pp if layout.kind == "pp" else 1,
                           placement=placement)
