"""The adapter between llama.cpp recipes and its option tables (engines/optiontable.py), extracted
from common/arg.cpp and tools/rpc/rpc-server.cpp of the pinned source by
scripts/extract-llamacpp-options (orchestrator/engines/llamacpp/options.json)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("options.json")


@cache
def table(rpc: bool = False) -> Any:
    """llama-server's table, or rpc-server's (`rpc_flags` in the same file)."""
    from orchestrator.engines.optiontable import OptionTable

    data = json.loads(TABLE.read_text())
    prov = data["provenance"]
    name = "rpc-server of llama.cpp" if rpc else "llama.cpp"
    return OptionTable(engine=name, version=prov["version"],
                       flags=data["rpc_flags" if rpc else "serve_flags"])


def version() -> str:
    return str(table().version)


def check_serve_args(argv: list[str]) -> list[str]:
    return [f"serve_args: {p}" for p in table().check_flags(list(argv))]


def check_rpc_args(argv: list[str]) -> list[str]:
    return [f"rpc_args: {p}" for p in table(rpc=True).check_flags(list(argv))]


def canonical(flag: str, rpc: bool = False) -> str:
    """The canonical spelling of a flag or one of its aliases (`-ngl` -> `--gpu-layers`);
    unknown flags come back as given."""
    flags = table(rpc).flags
    if flag in flags:
        return flag
    return next((str(name) for name, info in flags.items() if flag in (info.get("aliases") or [])),
                flag)
