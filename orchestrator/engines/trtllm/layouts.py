"""TensorRT-LLM's layouts for `sparkctl advise`: one node, or tensor parallel over all nodes
(one MPI rank per Spark; sparkctl runs one TensorRT-LLM server at a time, so no replicas)."""

from __future__ import annotations

from orchestrator.engines.layouts import Layout, Published, revalidated, standard_layouts
from orchestrator.engines.trtllm.recipe import Recipe


class TrtllmLayouts:
    efficiency = 0.41
    """Fitted to NVIDIA's Qwen3-235B-A22B NVFP4 TP2 on two Sparks (11.73 t/s at one request):
    docs/advise.md."""

    published = (
        Published("Qwen3-235B-A22B NVFP4 TP2, batch 1", "nvidia/Qwen3-235B-A22B-FP4",
                  Layout("tp", tp=2), 1, 11.73, "NVIDIA (DGX Spark performance figures)"),
    )

    def layouts(self, recipe: Recipe, nodes: int) -> list[Layout]:
        return standard_layouts(nodes, ("single", "tp"))

    def recipe_for(self, recipe: Recipe, layout: Layout, placement: list[str] | None) -> Recipe:
        return revalidated(recipe, tp_size=layout.tp, nodes=layout.tp)
