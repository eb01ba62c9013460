"""SGLang recipes: the model, the parallelism, speculative decoding, the image and extra
`python -m sglang.launch_server` flags.

Refused before anything runs (exit 2): a node count that is not tp x pp (one GPU per Spark),
flags sparkctl sets itself, any flag SGLang's own argument parser would reject (the option table
extracted from the pinned SGLang wheel; the error names the flag, the version and the nearest
valid flag), and the combinations SGLang 0.5.12's ServerArgs refuses at start-up (each check
cites the line of sglang/srt/server_args.py it mirrors). Nothing else is invented here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from orchestrator.engines.base import EnvVars, verdict_of
from orchestrator.recipe import SPARK_MEMORY_GB, BaseRecipe, MemoryEstimate, StrictModel

if TYPE_CHECKING:
    from orchestrator.recipe import ListenPort

DEFAULT_IMAGE = "scitrera/dgx-spark-sglang:0.5.12"
"""A community SGLang build for DGX Spark (aarch64, CUDA 13, sm_121) at the version the option
table was extracted from (orchestrator/engines/sglang/options.json)."""
IMAGE_PATTERN = r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$"
RESERVED_FLAGS = {
    "--host": "launch --host", "--port": "port (or launch --port)",
    "--model-path": "model", "--revision": "revision",
    "--tensor-parallel-size": "tp_size", "--pipeline-parallel-size": "pp_size",
    "--nnodes": "the node count", "--node-rank": "(set per node)",
    "--dist-init-addr": "dist_port (the head's fabric address is used)",
    "--mem-fraction-static": "memory.kv_cache_fraction",
    "--trust-remote-code": "trust_remote_code",
    "--speculative-algorithm": "speculative.algorithm",
    "--speculative-num-steps": "speculative.num_steps",
    "--speculative-eagle-topk": "speculative.eagle_topk",
    "--speculative-num-draft-tokens": "speculative.num_draft_tokens",
    "--speculative-draft-model-path": "speculative.draft_model",
}
SOURCE = "sglang/srt/server_args.py of SGLang 0.5.12"


class Speculative(StrictModel):
    algorithm: str = Field(pattern=r"^[A-Za-z0-9_]{1,32}$")
    """EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DFLASH (SGLang upper-cases it, l.3562)."""
    num_steps: int | None = Field(default=None, ge=1, le=64)
    eagle_topk: int | None = Field(default=None, ge=1, le=64)
    num_draft_tokens: int | None = Field(default=None, ge=1, le=256)
    draft_model: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    """Only for EAGLE/EAGLE3/STANDALONE/DFLASH drafts; NEXTN uses the model's own MTP heads."""

    @property
    def name(self) -> str:
        return self.algorithm.upper()

    @property
    def drafting(self) -> str:
        """What `recipes list` prints: the algorithm and its steps, when set."""
        return f"{self.name} {self.num_steps}" if self.num_steps else self.name


class Recipe(BaseRecipe):
    engine: Literal["sglang"] = "sglang"
    port: int = Field(default=30000, ge=1024, le=65535)
    image: str = Field(default=DEFAULT_IMAGE, pattern=IMAGE_PATTERN)
    tp_size: int = Field(default=1, ge=1, le=64)
    pp_size: int = Field(default=1, ge=1, le=64)
    trust_remote_code: bool = False
    speculative: Speculative | None = None
    dist_port: int = Field(default=20000, ge=1024, le=65535)
    """Port of --dist-init-addr on the first serving node's fabric address (multi-node only)."""
    serve_args: list[str] = Field(default_factory=list)
    """More launch_server flags, verbatim (each item one argv word), checked against the table."""
    env: EnvVars = Field(default_factory=dict)

    @property
    def drafting(self) -> str | None:
        return self.speculative.drafting if self.speculative else None

    @property
    def draft_tokens(self) -> int | None:
        return self.speculative.num_steps if self.speculative else None

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def node_count(self) -> int:
        return self.nodes or (len(self.placement) if self.placement else self.world_size)

    def listen_ports(self, nodes: list[str]) -> list[ListenPort]:
        from orchestrator.recipe import ListenPort

        # rank 0 listens for the others' torch.distributed rendezvous (--dist-init-addr)
        extra = [ListenPort(nodes[0], self.dist_port, "dist-init", "set dist_port in the recipe")]
        return [*super().listen_ports(nodes), *(extra if self.node_count > 1 else [])]

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        from orchestrator.engines.optiontable import refuse_serve_args
        from orchestrator.engines.sglang.options import canonical, check_serve_args, values

        if self.node_count != self.world_size:
            raise ValueError(
                f"the recipe spans {self.node_count} node(s) but tp_size x pp_size is "
                f"{self.world_size}: a Spark has one GPU, so SGLang needs one node per rank "
                f"({SOURCE} l.7231 also asserts tp x pp divisible by --nnodes)")
        refuse_serve_args(self.serve_args, RESERVED_FLAGS, canonical, check_serve_args)
        extra = values(self.serve_args)
        spec = self.speculative
        if spec is not None:
            self._check_speculative(spec, extra)
        return self

    def _check_speculative(self, spec: Speculative, extra: dict[str, str | bool]) -> None:
        if spec.name in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE") and spec.num_steps is None \
                and (spec.eagle_topk is not None or spec.num_draft_tokens is not None):
            # l.3808-3812: auto-chosen params assert topk and num_draft_tokens are unset too
            raise ValueError("speculative: eagle_topk / num_draft_tokens need num_steps; SGLang "
                             f"asserts they are unset when num_steps is ({SOURCE} l.3808)")
        if self.pp_size > 1:
            # l.7250-7253: pipeline parallelism excludes speculative decoding
            raise ValueError("speculative decoding with pp_size > 1: SGLang asserts 'Pipeline "
                             f"parallelism is not compatible with ... speculative decoding' "
                             f"({SOURCE} l.7250)")
        topk = spec.eagle_topk or 1
        backend = str(extra.get("--attention-backend") or "")
        if topk > 1 and "trtllm_mha" in (backend, extra.get("--decode-attention-backend"),
                                         extra.get("--prefill-attention-backend")):
            raise ValueError("speculative.eagle_topk > 1 with the trtllm_mha attention backend: "
                             f"'trtllm_mha backend only supports topk = 1' ({SOURCE} l.3822)")
        page = extra.get("--page-size")
        if topk > 1 and page and str(page).isdigit() and int(str(page)) > 1 \
                and backend not in ("flashinfer", "fa3"):
            raise ValueError("speculative.eagle_topk > 1 with --page-size > 1 needs "
                             f"--attention-backend flashinfer or fa3 ({SOURCE} l.3837)")
        if spec.name == "DFLASH" and not spec.draft_model:
            raise ValueError(f"speculative: DFLASH requires a draft_model ({SOURCE} l.3600)")
        check_draft_tokens(spec)

    @property
    def repos(self) -> list[tuple[str, str, str | None]]:
        found: list[tuple[str, str, str | None]] = [(self.model, self.revision, None)]
        if self.speculative and self.speculative.draft_model:
            found.append((self.speculative.draft_model, "main", None))
        return found


def check_draft_tokens(spec: Speculative) -> None:
    """EAGLE's draft tree with num_steps given: ServerArgs picks nothing itself (l.3807-3816
    only runs without num_steps) and fixes num_draft_tokens only for eagle_topk 1 (l.3828-3835,
    to num_steps + 1), so topk > 1 without it reaches tokenizer_manager.py l.281,
    `max(eagle_topk * num_steps, num_draft_tokens)`: `max(20, None)`, a TypeError at start-up."""
    if spec.name not in ("EAGLE", "EAGLE3", "NEXTN") or spec.num_steps is None:
        return
    if spec.eagle_topk is None:
        # l.3838 compares speculative_eagle_topk > 1: None there is a TypeError too
        raise ValueError(f"speculative: {spec.name} with num_steps needs eagle_topk (1 for a "
                         f"chain of drafts; SGLang compares it at {SOURCE} l.3838)")
    topk, steps = spec.eagle_topk, spec.num_steps
    # the draft tree's candidates: topk after the first step, topk x topk after each other one;
    # verification takes the best num_draft_tokens - 1 of them (eagle_utils.py l.28, topk > 1
    # running spec v1: server_args.py l.3749)
    candidates = topk + (steps - 1) * topk * topk
    if topk > 1 and spec.num_draft_tokens is None:
        raise ValueError(
            f"speculative: {spec.name} with eagle_topk {topk} > 1 needs num_draft_tokens: "
            f"SGLang 0.5.12 sets it itself only for eagle_topk 1 ({SOURCE} l.3828) and then "
            f"fails at start-up in tokenizer_manager.py l.281 (TypeError from max({topk} x "
            f"{steps}, None)); set speculative.num_draft_tokens: {topk * steps} (eagle_topk x "
            f"num_steps, the tokens SGLang reserves anyway; any value 2..{candidates + 1})")
    if topk > 1 and spec.num_draft_tokens is not None and spec.num_draft_tokens - 1 > candidates:
        raise ValueError(
            f"speculative: num_draft_tokens {spec.num_draft_tokens} exceeds what an eagle_topk "
            f"{topk}, num_steps {steps} tree proposes ({candidates} candidates + the root): "
            f"SGLang's torch.topk over them fails (eagle_utils.py l.28); set at most "
            f"{candidates + 1}")


def estimate_memory(recipe: Recipe, node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
    """Per node: SGLang's static pool (--mem-fraction-static of the memory) holds the target
    model's weights and its KV cache; a draft worker (EAGLE/NEXTN) loads after the pool is sized
    and allocates its own weights and KV pool on top (model_runner_kv_cache_mixin.py: the draft
    reuses the target's pool size without profiling), like activations and CUDA graphs
    (runtime_gb); the rest is the system's."""
    m = recipe.memory
    weights = m.weights_gb / recipe.world_size
    pool = m.kv_cache_fraction * node_memory_gb
    kv = pool - weights
    total = pool + m.draft_gb + m.runtime_gb
    free = node_memory_gb - total
    loaded = weights + m.draft_gb + m.runtime_gb
    fits, verdict = verdict_of(node_memory_gb - loaded, free, m.system_reserve_gb)
    if kv <= 0:
        fits, verdict = False, "does not fit"
    explanation = (
        f"per node {weights:.1f} GB weights inside SGLang's static pool {m.kv_cache_fraction:g} "
        f"x {node_memory_gb:g} GB = {pool:.1f} GB (--mem-fraction-static), leaving {kv:.1f} GB "
        f"KV cache; + {m.draft_gb:g} GB draft + {m.runtime_gb:g} GB runtime outside it = "
        f"{total:.1f} GB; {free:.1f} GB left for the system (reserve {m.system_reserve_gb:g} GB): "
        f"{verdict}")
    if kv <= 0:
        explanation += " (the weights exceed --mem-fraction-static: raise it or add nodes)"
    return MemoryEstimate(
        weights_gb=round(weights, 2), draft_gb=m.draft_gb, runtime_gb=m.runtime_gb,
        system_reserve_gb=m.system_reserve_gb, kv_cache_gb=round(max(kv, 0.0), 2),
        total_gb=round(total, 2), free_after_kv_gb=round(free, 2), fits=fits, verdict=verdict,
        explanation=explanation)
