"""Recipes: which model to serve across the cluster, and how (pydantic-validated YAML).

A recipe names the model (and its speculative-decoding draft model), the parallelism, the
trtllm-serve flags, the extra LLM API options and the memory settings. Built-in recipes live in
orchestrator/recipes/*.yml; users pass their own as a file path. Everything that would make the
server fail minutes into loading (a tp_size that is not the node count, an unknown decoding
type, a missing draft model, more nodes than the inventory has) is refused here, before anything
runs, with exit code 2.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import Field, model_validator

from orchestrator.engines.base import verdict_of
from orchestrator.recipe import (
    CONTAINER_HF_HOME,
    REPO_PATTERN,
    REVISION_PATTERN,
    SPARK_MEMORY_GB,
    BaseRecipe,
    MemoryEstimate,
    StrictModel,
)

NEEDS_DRAFT = ("Eagle", "Eagle3", "Draft_Target")
# Options sparkctl sets itself from typed recipe fields: setting them twice would be ambiguous.
RESERVED_OPTIONS = ("speculative_config", "tensor_parallel_size", "max_num_tokens", "backend")


class Speculative(StrictModel):
    decoding_type: Literal["Eagle", "Eagle3", "Draft_Target", "MTP", "NGram"]
    """TensorRT-LLM's speculative decoding type (PyTorch backend; `Eagle` is an alias of `Eagle3`;
    1.3.0rc13 spells the draft-model one `Draft_Target`)."""
    max_draft_len: int = Field(ge=1, le=64)
    """Tokens the draft proposes per step (NVIDIA's pages: 3 for Qwen3-235B, 5 for gpt-oss)."""
    draft_model: str | None = Field(default=None, pattern=REPO_PATTERN)
    """Hugging Face id of the draft model (required for Eagle, Eagle3 and DraftTarget)."""
    draft_revision: str = Field(default="main", pattern=REVISION_PATTERN)
    """Branch, tag or commit of the draft model."""
    draft_dir: str | None = Field(default=None, pattern=r"^/[A-Za-z0-9._/-]+$")
    """Directory of the draft model inside the container; default: under the mounted HF cache
    (so it survives container re-creation), /root/.cache/huggingface/drafts/<name>."""
    options: dict[str, Any] = Field(default_factory=dict)
    """More speculative_config fields (e.g. eagle3_one_model), passed through as they are."""

    @model_validator(mode="after")
    def _draft_when_needed(self) -> Speculative:
        if self.decoding_type in NEEDS_DRAFT and not self.draft_model:
            raise ValueError(
                f"decoding_type {self.decoding_type} needs a draft model: set "
                "speculative.draft_model to its Hugging Face id"
            )
        reserved = {"decoding_type", "max_draft_len", "speculative_model_dir", "speculative_model"}
        clash = sorted(reserved & set(self.options))
        if clash:
            raise ValueError(f"speculative.options must not set {', '.join(clash)}: use the typed fields")
        return self

    @property
    def draft_path(self) -> str | None:
        if not self.draft_model:
            return None
        return self.draft_dir or f"{CONTAINER_HF_HOME}/drafts/{self.draft_model.split('/')[-1]}"


class Recipe(BaseRecipe):
    engine: Literal["trtllm"] = "trtllm"
    tp_size: int = Field(default=1, ge=1, le=64)
    """Tensor parallel size; must equal the number of nodes (one GPU per Spark)."""
    backend: Literal["pytorch"] = "pytorch"
    max_num_tokens: int | None = Field(default=None, ge=1)
    """trtllm-serve --max_num_tokens."""
    speculative: Speculative | None = None
    """Speculative decoding (the draft model and how it drafts)."""
    serve_args: list[str] = Field(default_factory=list)
    """More trtllm-serve flags, verbatim (each item one argv word)."""
    llm_api_options: dict[str, Any] = Field(default_factory=dict)
    """More extra LLM API options (TensorRT-LLM field names), written to the YAML config."""

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        if self.node_count != self.tp_size:
            raise ValueError(
                f"tp_size {self.tp_size} must equal the number of nodes {self.node_count}: "
                "one GPU per Spark, and TensorRT-LLM needs tp_size == MPI world size"
            )
        clash = sorted(set(RESERVED_OPTIONS) & set(self.llm_api_options))
        if clash:
            raise ValueError(
                f"llm_api_options must not set {', '.join(clash)}: use the recipe's own fields "
                "(speculative, tp_size, max_num_tokens, backend)"
            )
        kv_cache = self.llm_api_options.get("kv_cache_config")
        if kv_cache is not None and not isinstance(kv_cache, dict):
            # sparkctl adds free_gpu_memory_fraction to it, so it must be a mapping
            raise ValueError(f"llm_api_options.kv_cache_config must be a mapping of "
                             f"TensorRT-LLM KvCacheConfig fields, got {type(kv_cache).__name__}")
        for flag in self.serve_args:
            if flag.split("=")[0] in ("--host", "--port", "--tp_size", "--extra_llm_api_options",
                                      "--config"):
                raise ValueError(f"serve_args must not set {flag}: sparkctl sets it")
        self._check_against_table()
        return self

    def _check_against_table(self) -> None:
        """Refuse what trtllm-serve itself would refuse minutes into a launch: flags its click
        parser does not know, YAML keys TorchLlmArgs forbids (naming what replaced a removed one)."""
        from orchestrator.engines.trtllm.options import check_llm_api_config, check_serve_args

        problems = check_serve_args(self.serve_args)
        if problems:
            raise ValueError("serve_args: " + "; ".join(problems))
        problems = check_llm_api_config(self.llm_api_config())
        if problems:
            raise ValueError("llm_api_options: " + "; ".join(problems))

    @property
    def drafting(self) -> str | None:
        spec = self.speculative
        return f"{spec.decoding_type} {spec.max_draft_len}" if spec else None

    @property
    def draft_tokens(self) -> int | None:
        return self.speculative.max_draft_len if self.speculative else None

    @property
    def node_count(self) -> int:
        return self.nodes or self.tp_size

    @property
    def repos(self) -> list[tuple[str, str, str | None]]:
        """(HF id, revision, local dir or None for the HF cache layout) of every model needed."""
        out: list[tuple[str, str, str | None]] = [(self.model, self.revision, None)]
        if self.speculative and self.speculative.draft_model:
            out.append((self.speculative.draft_model, self.speculative.draft_revision,
                        self.speculative.draft_path))
        return out

    def llm_api_config(self) -> dict[str, Any]:
        """The extra LLM API options file's content (TensorRT-LLM field names)."""
        config: dict[str, Any] = json.loads(json.dumps(self.llm_api_options))
        kv = dict(config.get("kv_cache_config") or {})
        kv.setdefault("free_gpu_memory_fraction", self.memory.kv_cache_fraction)
        config["kv_cache_config"] = kv
        if self.speculative:
            spec: dict[str, Any] = {
                "decoding_type": self.speculative.decoding_type,
                "max_draft_len": self.speculative.max_draft_len,
            }
            if self.speculative.draft_path:
                spec["speculative_model_dir"] = self.speculative.draft_path
            spec.update(self.speculative.options)
            config["speculative_config"] = spec
        return config


def draft_dir_warning(recipe: Recipe) -> str | None:
    path = recipe.speculative.draft_path if recipe.speculative else None
    if path and not PurePosixPath(path).is_relative_to(CONTAINER_HF_HOME):
        return (f"draft_dir {path} is outside the mounted HF cache: it lives in the container "
                "and is downloaded again whenever the container is re-created")
    return None


def estimate_memory(recipe: Recipe, node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
    """Weights split by tp, the draft whole on each node, then the KV cache takes its fraction
    of what is left after loading (that is how TensorRT-LLM sizes it)."""
    memory = recipe.memory
    weights = memory.weights_gb / recipe.tp_size
    loaded = weights + memory.draft_gb + memory.runtime_gb
    left = node_memory_gb - loaded
    kv = max(0.0, left * memory.kv_cache_fraction)
    free = left - kv
    fits, state = verdict_of(left, free, memory.system_reserve_gb)
    if state == "does not fit":
        verdict = (f"does NOT fit: weights and runtime take {loaded:.1f} of {node_memory_gb:.0f} GB, "
                   f"leaving {left:.1f} GB (the OS needs ~{memory.system_reserve_gb:.0f} GB); "
                   "use more nodes or a smaller model")
    elif not fits:
        verdict = (f"tight: the KV cache fraction {memory.kv_cache_fraction} leaves only "
                   f"{free:.1f} GB for the OS and page cache; lower memory.kv_cache_fraction")
    else:
        verdict = f"fits, with {free:.1f} GB left for the OS and page cache"
    explanation = (
        f"per node: weights {memory.weights_gb:g} GB / tp {recipe.tp_size} = {weights:.1f} GB, "
        f"draft {memory.draft_gb:.1f} GB, runtime ~{memory.runtime_gb:.1f} GB -> {loaded:.1f} GB "
        f"loaded; KV cache {memory.kv_cache_fraction:g} x {max(left, 0):.1f} GB left = {kv:.1f} GB; "
        f"{verdict} (estimate against {node_memory_gb:.0f} GB unified memory)"
    )
    return MemoryEstimate(
        weights_gb=round(weights, 2), draft_gb=memory.draft_gb, runtime_gb=memory.runtime_gb,
        system_reserve_gb=memory.system_reserve_gb, kv_cache_gb=round(kv, 2),
        total_gb=round(loaded + kv, 2), free_after_kv_gb=round(free, 2), fits=fits,
        verdict=state, explanation=explanation,
    )
