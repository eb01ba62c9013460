"""Code that runs on the nodes, kept as real .py files: linted, unit-tested locally, and shipped
as package data. sparkctl sends a script on stdin (`python3 -`) or writes it to a node path; it
is never built as a string inside the controller's code.

These scripts run on the node's own Python (3.8 or newer) and use only its standard library.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def script(name: str) -> str:
    """The text of node-side script NAME (e.g. "gather.py")."""
    return files("orchestrator.node").joinpath(name).read_text()
