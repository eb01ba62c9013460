"""Validation of the extra LLM API options YAML with TensorRT-LLM's field names.

Errors read like pydantic's (the real TorchLlmArgs forbids unknown fields).
"""
from __future__ import annotations

from typing import Any

ANY = object()
TOP_LEVEL: dict[str, Any] = {
    **{k: int for k in ("tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size",
                        "gpus_per_node", "moe_cluster_parallel_size", "moe_tensor_parallel_size",
                        "moe_expert_parallel_size", "max_batch_size", "max_input_len",
                        "max_seq_len", "max_beam_width", "max_num_tokens",
                        "num_postprocess_workers", "iter_stats_max_iterations",
                        "request_stats_max_iterations", "stream_interval",
                        "batch_wait_timeout_iters", "max_prompt_adapter_token")},
    **{k: bool for k in ("enable_attention_dp", "enable_chunked_prefill", "enable_lora",
                         "disable_overlap_scheduler", "enable_autotuner", "enable_iter_perf_stats",
                         "enable_iter_req_stats", "print_iter_log", "trust_remote_code",
                         "skip_tokenizer_init", "enable_min_latency", "enable_mixed_sampler",
                         "enable_trtllm_sampler", "gather_generation_logits",
                         "enable_layerwise_nvtx_marker", "force_dynamic_quantization",
                         "return_perf_metrics", "mm_encoder_only", "use_cuda_graph",
                         "enable_prompt_adapter", "fail_fast_on_attention_window_too_large",
                         "enable_sleep")},
    **{k: ANY for k in ("backend", "load_format", "guided_decoding_backend", "lora_config",
                        "peft_cache_config", "scheduler_config", "cache_transceiver_config",
                        "moe_config", "attn_backend", "sampler_type", "kv_cache_dtype",
                        "torch_compile_config", "allreduce_strategy", "checkpoint_loader",
                        "checkpoint_format", "tokenizer", "tokenizer_mode", "revision",
                        "tokenizer_revision", "dtype", "quant_config", "calib_config",
                        "otlp_traces_endpoint", "reasoning_parser", "postprocess_tokenizer_dir",
                        "garbage_collection_gen0_threshold", "cp_config", "batched_logits_processor",
                        "model", "model_kwargs", "speculative_model", "decoding_config",
                        "build_config", "batch_wait_timeout_ms", "batch_wait_max_tokens_ratio",
                        "orchestrator_type", "sparse_attention_config", "ray_worker_extension_cls",
                        "kv_connector_config", "layer_wise_benchmarks_config")},
    "kv_cache_config": dict, "cuda_graph_config": dict, "speculative_config": dict,
}
KV_CACHE = {"free_gpu_memory_fraction": float, "enable_block_reuse": bool, "max_tokens": int,
            "max_attention_window": list, "sink_token_length": int, "host_cache_size": int,
            "onboard_blocks": bool, "dtype": str, "copy_on_partial_reuse": bool,
            "event_buffer_max_size": int, "enable_partial_reuse": bool,
            "secondary_offload_min_priority": int, "use_uvm": bool, "tokens_per_block": int,
            "cross_kv_cache_fraction": float, "mamba_ssm_cache_dtype": str,
            "attention_dp_events_gather_period_ms": int, "max_gpu_total_bytes": int}
CUDA_GRAPH = {"batch_sizes": list, "max_batch_size": int, "enable_padding": bool}
SPEC_COMMON = {"decoding_type": str, "max_draft_len": int, "max_total_draft_tokens": int,
               "speculative_model_dir": str, "speculative_model": str, "max_concurrency": int,
               "load_format": str, "acceptance_window": int,
               "acceptance_length_threshold": float, "draft_len_schedule": dict}
EAGLE = {**SPEC_COMMON, "eagle_choices": list, "greedy_sampling": bool,
         "posterior_threshold": float, "use_dynamic_tree": bool, "dynamic_tree_max_topK": int,
         "num_eagle_layers": int, "max_non_leaves_per_layer": int, "eagle3_one_model": bool,
         "eagle3_layers_to_capture": list, "pytorch_weights_path": str,
         "eagle3_model_arch": str}
SPEC_TYPES = {
    "Eagle": EAGLE, "Eagle3": EAGLE,
    "DraftTarget": SPEC_COMMON,
    "MTP": {**SPEC_COMMON, "num_nextn_predict_layers": int, "use_relaxed_acceptance_for_thinking":
            bool, "relaxed_topk": int, "relaxed_delta": float, "use_mtp_vanilla": bool,
            "mtp_eagle_one_model": bool, "num_nextn_predict_layers_from_model_config": int},
    "NGram": {**SPEC_COMMON, "max_matching_ngram_size": int, "is_keep_all": bool,
              "is_use_oldest": bool, "is_public_pool": bool},
    "Medusa": {**SPEC_COMMON, "medusa_choices": list, "num_medusa_heads": int},
    "Lookahead": {**SPEC_COMMON, "max_window_size": int, "max_ngram_size": int,
                  "max_verification_set_size": int},
    "UserProvided": {**SPEC_COMMON, "drafter": ANY, "resource_manager": ANY},
    "SaveState": {**SPEC_COMMON, "output_directory": str, "write_interval": int,
                  "file_prefix": str},
    "AUTO": SPEC_COMMON,
}
NAMES = {int: "int", float: "float", bool: "bool", str: "str", list: "list", dict: "dict"}


class ValidationError(ValueError):
    """Message shaped like pydantic_core's ValidationError."""

    def __init__(self, model: str, problems: list[tuple[str, str, str, Any]]) -> None:
        lines = [f"{len(problems)} validation error{'s' if len(problems) > 1 else ''} for {model}"]
        for loc, msg, kind, value in problems:
            lines += [loc, f"  {msg} [type={kind}, input_value={value!r}, "
                           f"input_type={type(value).__name__}]"]
        super().__init__("\n".join(lines))


def _check(fields: dict[str, Any], data: dict, prefix: str,
           problems: list[tuple[str, str, str, Any]]) -> None:
    for key, value in data.items():
        loc = f"{prefix}{key}"
        if key not in fields:
            problems.append((loc, "Extra inputs are not permitted", "extra_forbidden", value))
            continue
        want = fields[key]
        if want is ANY or value is None:
            continue
        ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            kind = f"{NAMES[want]}_type" if want is not bool else "bool_parsing"
            problems.append((loc, f"Input should be a valid {NAMES[want]}", kind, value))


def validate(options: object) -> dict:
    """Returns the options, or raises ValidationError / ValueError like TorchLlmArgs does."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValidationError("TorchLlmArgs", [("", "Input should be a valid dictionary",
                                                "dict_type", options)])
    problems: list[tuple[str, str, str, Any]] = []
    _check(TOP_LEVEL, options, "", problems)
    for key, fields in (("kv_cache_config", KV_CACHE), ("cuda_graph_config", CUDA_GRAPH)):
        if isinstance(options.get(key), dict):
            _check(fields, options[key], f"{key}.", problems)
    kv = options.get("kv_cache_config") or {}
    frac = kv.get("free_gpu_memory_fraction") if isinstance(kv, dict) else None
    if isinstance(frac, int | float) and not 0 <= frac <= 1:
        problems.append(("kv_cache_config.free_gpu_memory_fraction",
                         "Value error, kv_cache_config.free_gpu_memory_fraction must be a float "
                         "between 0 and 1", "value_error", frac))
    if problems:
        raise ValidationError("TorchLlmArgs", problems)
    spec = options.get("speculative_config")
    if isinstance(spec, dict):
        validate_speculative(spec)
    return options


def validate_speculative(spec: dict) -> None:
    kind = spec.get("decoding_type")
    if kind not in SPEC_TYPES:
        raise ValueError(f"Invalid decoding type: {kind}")
    problems: list[tuple[str, str, str, Any]] = []
    _check(SPEC_TYPES[kind], spec, "", problems)
    if problems:
        name = {"Eagle": "EagleDecodingConfig", "Eagle3": "EagleDecodingConfig"}.get(
            kind, f"{kind}DecodingConfig")
        raise ValidationError(name, problems)
    draft_len = spec.get("max_draft_len")
    if kind in ("Eagle", "Eagle3", "DraftTarget", "NGram") and (
            not isinstance(draft_len, int) or draft_len <= 0):
        raise ValueError(f"max_draft_len must be > 0 for {kind} decoding (got {draft_len!r})")
    if kind in ("Eagle", "Eagle3") and not draft_model(spec):
        raise ValueError("Draft model must be provided for EAGLE")
    if kind == "DraftTarget" and not draft_model(spec):
        raise ValueError("Draft model must be provided for DraftTarget decoding "
                         "(speculative_model_dir)")


def draft_model(spec: dict | None) -> str | None:
    if not spec:
        return None
    return spec.get("speculative_model_dir") or spec.get("speculative_model")
