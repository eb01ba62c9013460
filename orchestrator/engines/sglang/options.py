"""The adapter between SGLang recipes and the option table (engines/optiontable.py), extracted
from the pinned SGLang wheel (orchestrator/engines/sglang/options.json)."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def table() -> Any:
    from orchestrator.engines.optiontable import load_table

    return load_table("sglang")


def version() -> str:
    return str(table().version)


def check_serve_args(argv: list[str]) -> list[str]:
    """What SGLang's own argparse parser would reject in these extra launch_server words: unknown
    options, ambiguous abbreviations (`--pp` starts three options), bad values. A unique
    abbreviation is accepted as argparse does (`--tp 1` is `--tp-size 1`, as the seed blog ran)."""
    return [str(problem) for problem in table().check_flags(list(argv))]


def canonical(flag: str) -> str:
    """The canonical spelling of a flag, one of its aliases or a unique abbreviation (`--tp-size`
    and `--tp` -> `--tensor-parallel-size`); unknown or ambiguous flags come back as given."""
    return str(table().canonical(flag) or flag)


def values(argv: list[str]) -> dict[str, str | bool]:
    """`--flag value`, `--flag=value` and store-true flags of argv, by canonical flag."""
    flags = table().flags
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("--"):
            i += 1
            continue
        flag, eq, inline = word.partition("=")
        name = canonical(flag)
        kind = (flags.get(name) or {}).get("kind")
        if eq:
            out[name] = inline
            i += 1
        elif kind == "store_true":
            out[name] = True
            i += 1
        else:
            out[name] = argv[i + 1] if i + 1 < len(argv) else ""
            i += 2
    return out
