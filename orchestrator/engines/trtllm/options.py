"""The adapter between TensorRT-LLM recipes and the option table (engines/optiontable.py),
generated from the transcription of TensorRT-LLM 1.3.0rc13's rendered source
(orchestrator/engines/trtllm/options.json; docs/option-tables.md says how).

Images of other versions (the inventory may still pin 1.3.0rc12, whose source cannot be had here)
are checked against the same table: rc12 -> rc13 changed no key sparkctl's recipes use, and the
table names its own version in every problem so nobody mistakes it for rc12's.
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def table() -> Any:
    from orchestrator.engines.optiontable import load_table

    return load_table("trtllm")


def version() -> str:
    return str(table().version)


def check_serve_args(argv: list[str]) -> list[str]:
    """What trtllm-serve's click parser would reject in these extra words."""
    return [str(problem) for problem in table().check_flags(list(argv))]


def check_llm_api_config(config: dict[str, Any]) -> list[str]:
    """What TorchLlmArgs (extra="forbid" everywhere) would reject in the YAML sparkctl writes."""
    return [str(problem) for problem in table().check_llm_args(config)]
