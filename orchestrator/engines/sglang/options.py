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
    """What SGLang's own argument parser would reject in these extra launch_server words. The
    abbreviations people type (--tp, --pp, --dp) point at SGLang's -size spelling rather than the
    nearest by edit distance (--tp would suggest --ep)."""
    import dataclasses

    out = []
    for problem in table().check_flags(list(argv)):
        sized = f"{problem.key}-size"
        if problem.message == "unknown option" and canonical(sized) != sized:
            problem = dataclasses.replace(problem, suggestion=sized)
        out.append(str(problem))
    return out


def canonical(flag: str) -> str:
    """The canonical spelling of a flag or one of its aliases (`--tp-size` ->
    `--tensor-parallel-size`); unknown flags come back as given."""
    flags = table().flags
    if flag in flags:
        return flag
    for name, info in flags.items():
        if flag in (info.get("aliases") or []):
            return str(name)
    return flag


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
