"""The adapter between vLLM recipes and the option table (engines/optiontable.py), extracted
from the pinned vLLM wheel (orchestrator/engines/vllm/options.json)."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def table() -> Any:
    from orchestrator.engines.optiontable import load_table

    return load_table("vllm")


def version() -> str:
    return str(table().version)


def canonical(flag: str) -> str:
    """vLLM's own spelling of a flag, an alias (-tp), an underscore form or an abbreviation that
    argparse would accept (--tensor-parallel); unknown flags come back as given."""
    return str(table().canonical(flag) or flag)


def check_serve_args(argv: list[str]) -> list[str]:
    """What vLLM's own argument parser would reject in these extra `vllm serve` words."""
    return [str(problem) for problem in table().check_flags(list(argv))]
