"""The node-side facts gatherer (orchestrator/node/gather.py), sent on stdin (`python3 -`)."""

from __future__ import annotations

from orchestrator.node import script


def gather_script() -> str:
    return script("gather.py")
