"""The adapter between vLLM recipes and the option table (engines/optiontable.py).

TODO(lead, merge of the `options` branch): optiontable.py and vllm/options.json are copies of that
branch's files; keep theirs. This adapter only relies on `load_table("vllm").check_flags(argv)`
returning problems whose str() names the flag, the engine version and the nearest valid flag.
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def table() -> Any:
    from orchestrator.engines.optiontable import load_table

    return load_table("vllm")


def version() -> str:
    return str(table().version)


def check_serve_args(argv: list[str]) -> list[str]:
    """What vLLM's own argument parser would reject in these extra `vllm serve` words."""
    return [str(problem) for problem in table().check_flags(list(argv))]
