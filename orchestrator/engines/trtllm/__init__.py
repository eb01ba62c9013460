"""TensorRT-LLM over MPI: a container with its own sshd on every node (the `up` container), and
named, placed servers in it: `mpirun ... trtllm-llmapi-launch trtllm-serve` started on each
server's first node, its ranks on the server's own nodes (a hostfile per server, over the fabric).

`up` adds the container and MPI phases; `launch` judges the server against every node's servers,
fetches the models, writes the server's files (RUN_DIR/servers/<name>/) and starts it; readiness
is /health, /health_generate (one token through every rank) and /v1/models. Several servers run
at once on other nodes, or on one node when its memory and ports allow.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """ENGINE, built on first use: importing this package (e.g. for its settings or recipes,
    engines/__init__.py) builds nothing, so a command imports only the engines it uses."""
    if name == "ENGINE":
        from orchestrator.engines.trtllm.engine import ENGINE

        return ENGINE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
