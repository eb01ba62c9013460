"""Validation of the extra LLM API options YAML against TensorRT-LLM's real contract.

The fields come from the option table sparkctl itself uses (orchestrator/engines/trtllm/options.json,
generated from TensorRT-LLM 1.3.0rc13's source); errors read like pydantic's (the real TorchLlmArgs
and every nested config forbid unknown fields).
"""
from __future__ import annotations

from typing import Any

from .common import option_table

# Semantic checks the option table cannot express (model validators at 1.3.0rc13), by decoding type.
NEEDS_DRAFT_LEN = ("Eagle", "Eagle3", "Draft_Target", "NGram", "SA")
NEEDS_DRAFT_MODEL = {"Eagle": "Draft model must be provided for EAGLE",
                     "Eagle3": "Draft model must be provided for EAGLE",
                     "Draft_Target": "speculative_model must be specified for DraftTarget"}
PYDANTIC = {"ge": ("greater_than_equal", "greater than or equal to"),
            "gt": ("greater_than", "greater than"),
            "le": ("less_than_equal", "less than or equal to"),
            "lt": ("less_than", "less than")}


class ValidationError(ValueError):
    """Message shaped like pydantic_core's ValidationError."""

    def __init__(self, model: str, problems: list[tuple[str, str, str, Any]]) -> None:
        lines = [f"{len(problems)} validation error{'s' if len(problems) > 1 else ''} for {model}"]
        for loc, msg, kind, value in problems:
            lines += [loc, f"  {msg} [type={kind}, input_value={value!r}, "
                           f"input_type={type(value).__name__}]"]
        super().__init__("\n".join(lines))


def _value(options: dict, path: str) -> Any:
    value: Any = options
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _pydantic(problem: Any, value: Any) -> tuple[str, str]:
    """(message, error type) as pydantic_core words them, for one table problem."""
    message = problem.message
    if message.startswith("is not a field of"):
        return "Extra inputs are not permitted", "extra_forbidden"
    if message.startswith("must be one of") or " is not one of " in message:
        wanted = message.split("one of ", 1)[1]
        return f"Input should be {wanted}", "literal_error"
    if " must be " in message:  # "1.5 must be <= 1"
        word, limit = message.split(" must be ", 1)[1].split(" ", 1)
        kind, words = PYDANTIC[{">=": "ge", ">": "gt", "<=": "le", "<": "lt"}[word]]
        return f"Input should be {words} {limit}", kind
    noun = message.rsplit(" ", 1)[-1]
    return f"Input should be a valid {noun}", "bool_parsing" if noun == "bool" else f"{noun}_type"


def validate(options: object) -> dict:
    """Returns the options, or raises ValidationError / ValueError like TorchLlmArgs does: the
    keys, types, Literal values and bounds come from TensorRT-LLM's option table (the one sparkctl
    checks recipes with), the decoding types' model validators from the lines below."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValidationError("TorchLlmArgs", [("", "Input should be a valid dictionary",
                                                "dict_type", options)])
    problems = [(p.key, *_pydantic(p, _value(options, p.key)), _value(options, p.key))
                for p in option_table("trtllm").check_llm_args(options)]
    if problems:
        spec_errors = [p for p in problems if p[0] == "speculative_config.decoding_type"]
        if spec_errors:
            raise ValueError(f"Invalid decoding type: {spec_errors[0][3]}")
        raise ValidationError("TorchLlmArgs", problems)
    spec = options.get("speculative_config")
    if isinstance(spec, dict):
        validate_speculative(spec)
    return options


def validate_speculative(spec: dict) -> None:
    kind = spec.get("decoding_type")
    draft_len = spec.get("max_draft_len")
    if kind in NEEDS_DRAFT_LEN and (not isinstance(draft_len, int) or draft_len <= 0):
        raise ValueError(f"max_draft_len must be > 0 for {kind} (got {draft_len!r})")
    if kind in NEEDS_DRAFT_MODEL and not draft_model(spec):
        raise ValueError(NEEDS_DRAFT_MODEL[kind])


def draft_model(spec: dict | None) -> str | None:
    if not spec:
        return None
    return spec.get("speculative_model_dir") or spec.get("speculative_model")
