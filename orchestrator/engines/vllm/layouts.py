"""vLLM's layouts for `sparkctl advise`: one node, tensor or pipeline parallel over all nodes.
sparkctl runs one vLLM server (one Ray cluster) at a time, so no replicas."""

from __future__ import annotations

from orchestrator.engines.layouts import Layout, Published, revalidated, standard_layouts
from orchestrator.engines.vllm.recipe import Recipe


class VllmLayouts:
    efficiency = 0.63
    """Fitted to Qwen3-235B-A22B GPTQ-Int4 TP2 on two Sparks (17.0 t/s at 1, 36.4 aggregate at
    4, conselara.dev) and MiniMax M2.7 NVFP4 TP2 (tg128 24.3 t/s, eugr PR#183); checked on a
    figure it was not fitted to (gpt-oss-120b on one Spark, ~59 t/s): docs/advise.md."""

    published = (
        Published("Qwen3-235B-A22B GPTQ-Int4 TP2, 1 request", "Qwen/Qwen3-235B-A22B-GPTQ-Int4",
                  Layout("tp", tp=2), 1, 17.0, "conselara.dev/notes/dgx-spark-benchmarks"),
        Published("Qwen3-235B-A22B GPTQ-Int4 TP2, 4 requests", "Qwen/Qwen3-235B-A22B-GPTQ-Int4",
                  Layout("tp", tp=2), 4, 36.4, "conselara.dev/notes/dgx-spark-benchmarks"),
        Published("MiniMax M2.7 NVFP4 TP2, tg128", "nvidia/MiniMax-M2.7-NVFP4",
                  Layout("tp", tp=2), 1, 24.3, "eugr/spark-vllm-docker PR#183"),
        Published("gpt-oss-120b MXFP4, 1 Spark, pure decode", "openai/gpt-oss-120b",
                  Layout("single"), 1, 59.0, "conselara.dev/notes/dgx-spark-benchmarks "
                  "(57-60 t/s, CUDA graphs on; Spark Arena: 58.82)", role="held-out"),
        Published("gpt-oss-120b MXFP4 TP2, two Sparks", "openai/gpt-oss-120b",
                  Layout("tp", tp=2), 1, 75.96, "Spark Arena leaderboard (as reported by "
                  "sectorhq.co)", role="held-out"),
        Published("MiniMax M2.7 MXFP4 TP2 over Ray (vLLM 0.18.1rc1)", "olka-fi/MiniMax-M2.7-MXFP4",
                  Layout("tp", tp=2), 1, 12.4, "the seed blog (al-engr.com): an older vLLM",
                  role="outlier"),
    )

    def layouts(self, recipe: Recipe, nodes: int) -> list[Layout]:
        return standard_layouts(nodes, ("single", "tp", "pp"))

    def recipe_for(self, recipe: Recipe, layout: Layout, placement: list[str] | None) -> Recipe:
        return revalidated(recipe, tensor_parallel_size=layout.tp,
                           pipeline_parallel_size=layout.pp, nodes=None)
