"""The node-side facts gatherer, sent as a script on stdin (`python3 -`)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def gather_script() -> str:
    return files("orchestrator.facts").joinpath("gather.py").read_text()
